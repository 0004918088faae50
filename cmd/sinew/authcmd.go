package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/sinewmq/sinew/internal/auth"
)

const authUsage = `usage: sinew auth token [--count N]

Prints N new static tokens (default 1), one a line: 32 bytes from the
operating system's random source as 64 hexadecimal digits (256 bits). Put
one in auth.tokens (sinew.toml, SINEW_AUTH_TOKENS or --auth-tokens); sinew
serve refuses a token shorter than 32 characters. Nothing is stored: a token
exists only where you put it.
`

// tokensCountMax bounds --count, so a slip of the finger does not fill the
// terminal.
const tokensCountMax = 100

func init() {
	commands["auth"] = command{
		summary: "generate a static token for auth.tokens",
		run:     runAuth,
	}
}

func runAuth(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "token" {
		fmt.Fprint(stderr, authUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			return flag.ErrHelp
		}
		return fmt.Errorf("%w: want sinew auth token", errUsage)
	}
	fs := newFlagSet("auth token", stderr)
	count := fs.Int("count", 1, fmt.Sprintf("how many tokens to print, 1 to %d", tokensCountMax))
	fs.Usage = func() {
		fmt.Fprint(stderr, authUsage+"\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *count < 1 || *count > tokensCountMax {
		return fmt.Errorf("%w: --count %d, want 1 to %d", errUsage, *count, tokensCountMax)
	}
	for range *count {
		if _, err := fmt.Fprintln(stdout, auth.GenerateToken()); err != nil {
			return err
		}
	}
	return nil
}
