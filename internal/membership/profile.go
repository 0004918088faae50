package membership

import (
	"fmt"
	"math"
	"time"
)

// Profile is the failure detector's timing. It maps the seed's SWIM table
// onto memberlist's knobs:
//
//	seed                               memberlist
//	---------------------------------  ------------------------------------
//	direct probe timeout               ProbeTimeout
//	indirect probe window              ProbeInterval - ProbeTimeout
//	indirect helpers                   IndirectChecks
//	suspicion timeout                  SuspicionMult * ProbeInterval (*)
//
// (*) for clusters of up to ten nodes; memberlist scales it by log10(n)
// beyond that. memberlist derives the suspicion timeout from the probe
// interval, so it is always a whole multiple of it.
type Profile struct {
	// Name says which profile this is, for logs.
	Name string
	// ProbeTimeout is how long a direct probe waits for its ack before
	// asking helpers to probe indirectly.
	ProbeTimeout time.Duration
	// ProbeInterval is the time between probes; a probe that got no ack,
	// direct or indirect, by its end marks the target suspect.
	ProbeInterval time.Duration
	// IndirectChecks is the number of helpers asked to probe indirectly.
	IndirectChecks int
	// SuspicionMult is the suspicion timeout in probe intervals.
	SuspicionMult int
	// ReconnectInterval is how often a node tries to rejoin peers it
	// holds dead or that it was cut off from (see Membership).
	ReconnectInterval time.Duration
}

// SeedProfile returns the default timings, those of the seed's SWIM table
// as near as memberlist can take them: a 5 s direct probe, a 3 s window
// for 3 indirect helpers, and a suspicion timeout of one probe interval
// (8 s; the seed's 10 s is not a multiple of the 8 s interval, and rounding
// down keeps detection inside the seed's 18 s bound). WorstCaseDetection
// is 16 s.
func SeedProfile() Profile {
	return Profile{
		Name:              "seed",
		ProbeTimeout:      5 * time.Second,
		ProbeInterval:     8 * time.Second,
		IndirectChecks:    3,
		SuspicionMult:     1,
		ReconnectInterval: 10 * time.Second,
	}
}

// LANProfile returns sub-second probes for a local network: a 250 ms
// direct probe, 250 ms for 3 indirect helpers and a suspicion timeout of
// two probe intervals (1 s). WorstCaseDetection is 1.5 s.
func LANProfile() Profile {
	return Profile{
		Name:              "lan",
		ProbeTimeout:      250 * time.Millisecond,
		ProbeInterval:     500 * time.Millisecond,
		IndirectChecks:    3,
		SuspicionMult:     2,
		ReconnectInterval: 500 * time.Millisecond,
	}
}

// Validate reports a profile memberlist cannot run as described.
func (p Profile) Validate() error {
	switch {
	case p.ProbeTimeout <= 0:
		return fmt.Errorf("%w: probe timeout %v must be positive", ErrBadConfig, p.ProbeTimeout)
	case p.ProbeInterval <= p.ProbeTimeout:
		return fmt.Errorf("%w: probe interval %v must exceed probe timeout %v, or no time is left for indirect probes",
			ErrBadConfig, p.ProbeInterval, p.ProbeTimeout)
	case p.IndirectChecks < 0 || p.IndirectChecks > 16:
		return fmt.Errorf("%w: indirect checks %d not in [0, 16]", ErrBadConfig, p.IndirectChecks)
	case p.SuspicionMult < 1 || p.SuspicionMult > 100:
		return fmt.Errorf("%w: suspicion multiplier %d not in [1, 100]", ErrBadConfig, p.SuspicionMult)
	case p.ReconnectInterval <= 0:
		return fmt.Errorf("%w: reconnect interval must be positive", ErrBadConfig)
	}
	return nil
}

// IndirectWindow is the time helpers have for indirect probes.
func (p Profile) IndirectWindow() time.Duration { return p.ProbeInterval - p.ProbeTimeout }

// SuspicionTimeout is how long a node stays suspect before it is declared
// dead, in a cluster of n nodes. It is memberlist's own formula: with a
// suspicion multiplier below 3 memberlist expects no confirmations from
// other nodes, so the timer runs for exactly this long.
func (p Profile) SuspicionTimeout(n int) time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	return time.Duration(p.SuspicionMult) * time.Duration(scale*1000) * p.ProbeInterval / 1000
}

// WorstCaseDetection is the time from the start of the first probe a
// crashed node fails to answer until it is declared dead, in a cluster of
// n nodes: the direct probe, the indirect window, then the suspicion
// timeout. It is the seed's "about 18 s" measured the same way; the wait
// for the probe round to reach the crashed node (at most n-1 probe
// intervals, as memberlist probes one node per interval) comes before it.
func (p Profile) WorstCaseDetection(n int) time.Duration {
	return p.ProbeTimeout + p.IndirectWindow() + p.SuspicionTimeout(n)
}
