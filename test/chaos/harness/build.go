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
