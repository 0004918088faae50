package main

import (
	"context"
	"fmt"
	"io"
	"strings"
)

func init() {
	commands["queue"] = command{
		summary: "delete or purge a queue: queue delete|purge --topic T [--group G]",
		run:     runQueue,
	}
}

// queueVerbs are the queue operations, with what each does for the help.
var queueVerbs = map[string]string{
	"delete": "remove the queue and every message in it (ready, delayed, inflight); its subscribers are told",
	"purge":  "discard the queue's ready and delayed messages; inflight ones stay with their consumers",
}

func runQueue(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || queueVerbs[args[0]] == "" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			queueUsage(stderr)
			return nil
		}
		queueUsage(stderr)
		if len(args) == 0 {
			return fmt.Errorf("%w: missing operation (delete or purge)", errUsage)
		}
		return fmt.Errorf("%w: unknown operation %q (delete or purge)", errUsage, args[0])
	}
	verb := args[0]
	fs := newFlagSet("queue "+verb, stderr)
	cf := addClientFlags(fs)
	topic := fs.String("topic", "", "queue topic (required)")
	group := fs.String("group", "", "queue group (default: the default group)")
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *topic == "" {
		return fmt.Errorf("%w: --topic is required", errUsage)
	}
	c, err := cf.dial(ctx, "sinew-queue", stderr)
	if err != nil {
		return err
	}
	defer c.Close()
	name := fmt.Sprintf("queue %q group %q", *topic, *group)
	switch verb {
	case "delete":
		if err := c.DeleteQueue(ctx, *topic, *group); err != nil {
			return describeClientErr(*cf.addr, err)
		}
		fmt.Fprintf(stdout, "deleted %s\n", name)
	case "purge":
		n, err := c.PurgeQueue(ctx, *topic, *group)
		if err != nil {
			return describeClientErr(*cf.addr, err)
		}
		fmt.Fprintf(stdout, "purged %d messages from %s\n", n, name)
	}
	return nil
}

func queueUsage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: sinew queue <operation> --topic T [--group G] [--addr host:port] [--token T]\n\noperations:\n")
	for _, v := range []string{"delete", "purge"} {
		fmt.Fprintf(&b, "  %-7s %s\n", v, queueVerbs[v])
	}
	b.WriteString("\nNeither creates the queue: a queue that does not exist is an error.\n" +
		"sinew admin queue purge|delete does the same over the admin API (docs/cli.md).\n")
	io.WriteString(w, b.String())
}
