package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
)

func init() {
	adminCommands["cohorts"] = adminCommand{summary: "cohorts (consumer groups): members, plan generation, and each partition's member, epoch, lag and pause", run: adminCohorts}
}

// apiCohorts is the answer of GET /api/v1/cohorts (docs/operations.md).
type apiCohorts struct {
	Cohorts []apiCohort `json:"cohorts"`
}

type apiCohort struct {
	Topic      string               `json:"topic"`
	Group      string               `json:"group"`
	Cohort     string               `json:"cohort"`
	Members    []string             `json:"members"`
	Planner    string               `json:"planner"`
	Generation uint64               `json:"generation"`
	Owners     []string             `json:"owners"`
	Paused     int64                `json:"paused"`
	Lag        int64                `json:"lag"`
	Partitions []apiCohortPartition `json:"partitions"`
}

type apiCohortPartition struct {
	Partition uint32 `json:"partition"`
	Planned   string `json:"planned"`
	Held      bool   `json:"held"`
	Member    string `json:"member"`
	Epoch     uint64 `json:"epoch"`
	Paused    bool   `json:"paused"`
	Lag       int64  `json:"lag"`
	Owned     bool   `json:"owned"`
	Owner     string `json:"owner"`
}

func adminCohorts(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	f := addAdminFlags(fs)
	topic := fs.String("topic", "", "only the cohorts of this queue topic (default: every queue)")
	group := fs.String("group", "", "with --topic: the queue's group (default: the default group)")
	c, err := adminSetup(fs, f, args)
	if err != nil {
		return err
	}
	path, q := "/api/v1/cohorts", url.Values(nil)
	switch {
	case *topic != "":
		path, q = "/api/v1/cohorts/"+url.PathEscape(*topic), groupQuery(*group)
	case *group != "":
		return fmt.Errorf("%w: --group needs --topic", errUsage)
	}
	var cs apiCohorts
	if render, err := adminGet(ctx, c, f, path, q, stdout, &cs); !render {
		return err
	}
	if len(cs.Cohorts) == 0 {
		fmt.Fprintln(stderr, "no cohorts")
		return nil
	}
	return writeCohorts(stdout, cs.Cohorts)
}

// writeCohorts prints the cohorts for a person: one line each, then a
// table of each cohort's partitions.
func writeCohorts(w io.Writer, cs []apiCohort) error {
	t := newTable(w, "TOPIC", "GROUP", "COHORT", "PLANNER", "GENERATION", "MEMBERS", "PAUSED", "LAG")
	for _, c := range cs {
		members := make([]string, len(c.Members))
		for i, m := range c.Members {
			members[i] = displayBytes([]byte(m))
		}
		t.row(c.Topic, groupCell(c.Group), c.Cohort, c.Planner, strconv.FormatUint(c.Generation, 10),
			shown(strings.Join(members, ",")), fmt.Sprintf("%d/%d", c.Paused, len(c.Partitions)), strconv.FormatInt(c.Lag, 10))
	}
	if err := t.flush(); err != nil {
		return err
	}
	for _, c := range cs {
		fmt.Fprintf(w, "\n%s cohort %s:\n", queueName(c.Topic, c.Group), strconv.Quote(c.Cohort))
		pt := newTable(w, "PARTITION", "MEMBER", "EPOCH", "LAG", "PAUSED", "PLANNED", "OWNER")
		for _, p := range c.Partitions {
			member := p.Member
			if !p.Held {
				member = "(not held)" // the gate is open, or another cohort's
			}
			owner := "here"
			switch {
			case !p.Owned && p.Owner != "":
				owner = p.Owner
			case !p.Owned:
				owner = "unknown"
			}
			pt.row(strconv.FormatUint(uint64(p.Partition), 10), member, strconv.FormatUint(p.Epoch, 10),
				strconv.FormatInt(p.Lag, 10), strconv.FormatBool(p.Paused), p.Planned, owner)
		}
		if err := pt.flush(); err != nil {
			return err
		}
	}
	return nil
}
