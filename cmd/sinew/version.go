package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

func init() {
	commands["version"] = command{
		summary: "print this binary's version (sinew --version does the same)",
		run:     runVersion,
	}
}

// versionInfo describes this binary. The release comes from serverVersion (the
// one HELLO_OK announces), so the CLI and the broker never disagree about it;
// the commit comes from the build's VCS stamp when there is one.
type versionInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

func currentVersion() versionInfo {
	v := versionInfo{
		Version:   strings.TrimPrefix(serverVersion, "sinew/"),
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	return v
}

// String is the one line `sinew --version` prints.
func (v versionInfo) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sinew %s (%s, %s", v.Version, v.GoVersion, v.Platform)
	if v.Commit != "" {
		c := v.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		fmt.Fprintf(&b, ", commit %s", c)
		if v.Modified {
			b.WriteString("+modified")
		}
	}
	b.WriteString(")")
	return b.String()
}

func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stderr)
	asJSON := fs.Bool("json", false, "print the version as a JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	v := currentVersion()
	if *asJSON {
		enc := json.NewEncoder(stdout)
		return enc.Encode(v)
	}
	_, err := fmt.Fprintln(stdout, v)
	return err
}
