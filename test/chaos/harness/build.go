package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// buildTimeout bounds `go build` of the broker.
const buildTimeout = 5 * time.Minute

// ErrNoServe is returned by CheckServe when the binary has no serve command.
var ErrNoServe = errors.New("harness: sinew binary has no serve command")

// RepoRoot walks up from the working directory to the directory holding the
// module's go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 64 {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			bytes.Contains(data, []byte("module github.com/sinewmq/sinew\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", errors.New("harness: go.mod of github.com/sinewmq/sinew not found above the working directory")
}

// Build compiles ./cmd/sinew of the module at root into dir and returns the
// binary's path. race adds the race detector to the broker itself, which is
// slower but catches data races under real faults.
func Build(root, dir string, race bool) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	out := filepath.Join(dir, "sinew")
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/sinew")
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: go %s: %w\n%s", strings.Join(args, " "), err, msg)
	}
	return out, nil
}

// CheckServe reports ErrNoServe when the binary's command list lacks serve.
func CheckServe(binary string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, binary, "help").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "serve" {
			return nil
		}
	}
	return fmt.Errorf("%w; `sinew help` says:\n%s", ErrNoServe, out)
}

// BuildCommit compiles ./cmd/sinew as it was at commit of the git
// repository at root: the commit's tree is exported (git archive) into a
// directory under dir and built there, with the module cache and build
// cache of this machine. The binary is dir/sinew-<commit>.
func BuildCommit(root, dir, commit string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	src, err := os.MkdirTemp(dir, "src-")
	if err != nil {
		return "", err
	}
	arch := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := arch.StdoutPipe()
	if err != nil {
		return "", err
	}
	untar.Stdin = pipe
	var archErr, untarErr bytes.Buffer
	arch.Stderr, untar.Stderr = &archErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", fmt.Errorf("harness: tar: %w", err)
	}
	if err := arch.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("%w: git archive %s: %v: %s", ErrNoCommit, commit, err, strings.TrimSpace(archErr.String()))
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("harness: tar -x: %w: %s", err, strings.TrimSpace(untarErr.String()))
	}
	bin, err := Build(src, src, false)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "sinew-"+commit)
	if err := os.Rename(bin, out); err != nil {
		return "", err
	}
	return out, os.RemoveAll(src)
}

// ErrNoCommit is returned by BuildCommit when the repository does not hold
// the commit (a shallow clone, an exported tree without git).
var ErrNoCommit = errors.New("harness: commit not in the repository")
