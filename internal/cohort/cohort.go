// Package cohort computes the assignment plans of cohorts (consumer
// groups): which member of a cohort is meant to consume each partition of
// a queue. It is pure: no goroutines, no clock, no I/O. The controller
// calls Next for each (queue, cohort) and commits the result; the
// partitions' delivery gates, not the plan, keep a partition to one member
// at a time, so a plan is advice.
//
// # Plans and generations
//
// A Plan names one owner per partition and carries a generation. Next
// keeps the generation when the owners it computes are the ones it was
// given, and adds one when they differ, so re-planning unchanged input
// publishes nothing new. The plan before the first (the zero Plan) has
// generation 0; Next gives the first plan that assigns a partition
// generation 1.
//
// # Assignment
//
// Next is sticky, spread and balanced: with M members and P partitions
// every member holds P/M or P/M+1 partitions (P%M of them hold one more),
// a partition stays with its previous owner while that owner is a member
// and within its share, and the partitions that must move go to the
// members short of their share, taken in turn. It is deterministic: the
// order of the members given, and duplicates among them, change nothing.
package cohort

import (
	"errors"
	"fmt"
	"slices"
)

// Plan is one cohort's assignment of a queue's partitions.
type Plan struct {
	// Generation goes up by one with every change of Owners (0: no plan
	// yet).
	Generation uint64 `json:"generation"`
	// Owners[i] is the member id assigned partition i ("" for none).
	Owners []string `json:"owners"`
}

// Assigned reports whether the plan assigns any partition.
func (p Plan) Assigned() bool {
	return slices.ContainsFunc(p.Owners, func(o string) bool { return o != "" })
}

// Next returns the plan that follows prev for a queue of partitions
// partitions and the given members (any order; duplicates and empty ids
// are ignored). Every partition gets a member when there is at least one;
// with none, every partition gets nobody. The generation is prev's when
// the owners equal prev.Owners (same length, same entries), prev's plus
// one otherwise; from a prev of generation 0, a plan that assigns nothing
// keeps generation 0. A negative partitions counts as 0.
func Next(prev Plan, partitions int, members []string) Plan {
	partitions = max(partitions, 0)
	ms := normalize(members)
	owners := assign(prev.Owners, partitions, ms)
	next := Plan{Generation: prev.Generation, Owners: owners}
	switch {
	case prev.Generation == 0 && !next.Assigned():
		next.Generation = 0
	case !slices.Equal(prev.Owners, owners):
		next.Generation = prev.Generation + 1
	}
	return next
}

// normalize returns members sorted, without duplicates or empty ids.
func normalize(members []string) []string {
	ms := make([]string, 0, len(members))
	for _, m := range members {
		if m != "" {
			ms = append(ms, m)
		}
	}
	slices.Sort(ms)
	return slices.Compact(ms)
}

// assign computes the owners of partitions partitions from the previous
// owners prev and the sorted, distinct members ms.
func assign(prev []string, partitions int, ms []string) []string {
	owners := make([]string, partitions)
	m := len(ms)
	if m == 0 {
		return owners
	}
	index := make(map[string]int, m)
	for i, id := range ms {
		index[id] = i
	}
	// kept[i]: how many partitions (below partitions) member i held.
	kept := make([]int, m)
	for p := 0; p < min(partitions, len(prev)); p++ {
		if i, ok := index[prev[p]]; ok {
			kept[i]++
		}
	}
	// Quotas: every member holds base, and the extra members that held
	// the most (ties in member order) hold one more, so the members
	// that keep most of their partitions are the ones allowed to.
	base, extra := partitions/m, partitions%m
	rank := make([]int, m)
	for i := range rank {
		rank[i] = i
	}
	slices.SortStableFunc(rank, func(a, b int) int { return kept[b] - kept[a] })
	quota := make([]int, m)
	for r, i := range rank {
		quota[i] = base
		if r < extra {
			quota[i]++
		}
	}
	// Keep: each member keeps its lowest partitions up to its quota.
	held := make([]int, m)
	for p := 0; p < min(partitions, len(prev)); p++ {
		if i, ok := index[prev[p]]; ok && held[i] < quota[i] {
			owners[p] = prev[p]
			held[i]++
		}
	}
	// Fill: the partitions without an owner go, lowest first, to the
	// members short of their quota, taken in turn in member order.
	next := 0
	for p := range owners {
		if owners[p] != "" {
			continue
		}
		for held[next] >= quota[next] {
			next = (next + 1) % m
		}
		owners[p] = ms[next]
		held[next]++
		next = (next + 1) % m
	}
	return owners
}

// MemberIDMax is the longest member id, in bytes.
const MemberIDMax = 128

// ErrMemberID reports a member id ValidMemberID refuses.
var ErrMemberID = errors.New("cohort: invalid member id")

// ErrName reports a cohort name ValidName refuses.
var ErrName = errors.New("cohort: invalid cohort name")

// ValidMemberID checks a member id: 1 to MemberIDMax bytes, each an ASCII
// letter or digit or one of '.', '_', ':' and '-'. It returns nil or an
// error that wraps ErrMemberID.
func ValidMemberID(id string) error { return valid(id, ErrMemberID) }

// ValidName checks a cohort's name by the same rule as a member id
// (ValidMemberID). It returns nil or an error that wraps ErrName.
func ValidName(name string) error { return valid(name, ErrName) }

func valid(s string, kind error) error {
	if len(s) == 0 {
		return fmt.Errorf("%w: empty", kind)
	}
	if len(s) > MemberIDMax {
		return fmt.Errorf("%w: %d bytes, at most %d", kind, len(s), MemberIDMax)
	}
	for i := 0; i < len(s); i++ {
		if !idByte(s[i]) {
			return fmt.Errorf("%w: byte %d is %q; use letters, digits, '.', '_', ':' and '-'", kind, i, s[i:i+1])
		}
	}
	return nil
}

func idByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		b == '.' || b == '_' || b == ':' || b == '-'
}
