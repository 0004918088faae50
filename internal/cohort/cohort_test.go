package cohort

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestNextTable(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prev       Plan
		partitions int
		members    []string
		want       Plan
	}{
		{"no members, no prior: no plan", Plan{}, 3, nil, Plan{0, []string{"", "", ""}}},
		{"first plan spreads in turn", Plan{}, 5, []string{"b", "a"}, Plan{1, []string{"a", "b", "a", "b", "a"}}},
		{"duplicates and empty ids ignored", Plan{}, 4, []string{"b", "", "a", "b", "a"}, Plan{1, []string{"a", "b", "a", "b"}}},
		{"unchanged input keeps the generation", Plan{7, []string{"a", "b", "a", "b"}}, 4, []string{"a", "b"}, Plan{7, []string{"a", "b", "a", "b"}}},
		{"a sticky layout that is not the fresh one stays", Plan{3, []string{"a", "a", "b", "b"}}, 4, []string{"b", "a"}, Plan{3, []string{"a", "a", "b", "b"}}},
		{"a member leaves: its partitions spread over the others", Plan{2, []string{"a", "b", "c", "a", "b", "c"}}, 6, []string{"a", "c"},
			Plan{3, []string{"a", "a", "c", "a", "c", "c"}}},
		{"a member joins: it takes only its share", Plan{2, []string{"a", "b", "a", "b", "a", "b"}}, 6, []string{"a", "b", "c"},
			Plan{3, []string{"a", "b", "a", "b", "c", "c"}}},
		{"the ceil goes to the member that keeps more", Plan{4, []string{"b", "b", "b", "a", "", ""}}, 5, []string{"a", "b"},
			Plan{5, []string{"b", "b", "b", "a", "a"}}},
		{"last member leaves: nobody, generation bumps", Plan{4, []string{"a", "a"}}, 2, nil, Plan{5, []string{"", ""}}},
		{"no one left and nothing changed", Plan{5, []string{"", ""}}, 2, nil, Plan{5, []string{"", ""}}},
		{"partitions grew", Plan{1, []string{"a", "b"}}, 4, []string{"a", "b"}, Plan{2, []string{"a", "b", "a", "b"}}},
		{"partitions shrank", Plan{1, []string{"a", "b", "a", "b"}}, 2, []string{"a", "b"}, Plan{2, []string{"a", "b"}}},
		{"shrank, owners rebalanced", Plan{1, []string{"a", "a", "b", "b"}}, 2, []string{"a", "b"}, Plan{2, []string{"a", "b"}}},
		{"more members than partitions: holders keep theirs", Plan{1, []string{"c", "a"}}, 2, []string{"a", "b", "c", "d"}, Plan{1, []string{"c", "a"}}},
		{"an owner that is no member loses its partition", Plan{1, []string{"x", "a"}}, 2, []string{"a", "b"}, Plan{2, []string{"b", "a"}}},
		{"zero partitions", Plan{}, 0, []string{"a"}, Plan{0, []string{}}},
		{"negative partitions count as zero", Plan{}, -3, []string{"a"}, Plan{0, []string{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Next(tc.prev, tc.partitions, tc.members)
			if got.Generation != tc.want.Generation || !slices.Equal(got.Owners, tc.want.Owners) {
				t.Fatalf("Next(%v, %d, %v) = %v, want %v", tc.prev, tc.partitions, tc.members, got, tc.want)
			}
			checkBalanced(t, got, tc.partitions, tc.members)
		})
	}
}

// TestNextDoesNotAlias: the plan Next returns shares nothing with prev
// or members.
func TestNextDoesNotAlias(t *testing.T) {
	prev := Plan{1, []string{"a", "b"}}
	members := []string{"b", "a"}
	got := Next(prev, 2, members)
	got.Owners[0] = "z"
	if prev.Owners[0] != "a" || members[0] != "b" {
		t.Fatalf("Next's result aliases its input: prev %v members %v", prev.Owners, members)
	}
}

// checkBalanced checks every partition has a member (when there are
// members), each member holds floor or ceil of partitions/members, and
// owners are members.
func checkBalanced(t *testing.T, p Plan, partitions int, members []string) {
	t.Helper()
	ms := normalize(members)
	partitions = max(partitions, 0)
	if len(p.Owners) != partitions {
		t.Fatalf("%d owners for %d partitions", len(p.Owners), partitions)
	}
	counts := map[string]int{}
	for i, o := range p.Owners {
		if len(ms) == 0 {
			if o != "" {
				t.Fatalf("partition %d owned by %q with no members", i, o)
			}
			continue
		}
		if !slices.Contains(ms, o) {
			t.Fatalf("partition %d owned by %q, not a member of %v", i, o, ms)
		}
		counts[o]++
	}
	if len(ms) == 0 {
		return
	}
	lo := partitions / len(ms)
	for _, m := range ms {
		if c := counts[m]; c != lo && c != lo+1 {
			t.Fatalf("member %s holds %d partitions, want %d or %d (%v)", m, c, lo, lo+1, p.Owners)
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func moved(a, b []string) int {
	n := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}

func randomMembers(r *rand.Rand, pool, n int) []string {
	ms := make([]string, 0, n)
	for range n {
		ms = append(ms, fmt.Sprintf("m%03d", r.IntN(pool)))
	}
	return ms
}

// TestNextProperties drives Next through random sequences of member sets
// and partition counts (bounded: 300 sequences of 12 steps) and checks
// at every step: balance; determinism under permutation and duplication
// of the members; a fixed point when re-run on its own output (and an
// unchanged generation); the generation bumps exactly when the owners
// change; a member joining a balanced plan moves at most ceil(P/M)
// partitions; a member leaving moves only its own partitions and at most
// ceil(P/M) others.
func TestNextProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(28, 2))
	for seq := range 300 {
		partitions := 1 + r.IntN(64)
		plan := Plan{}
		members := randomMembers(r, 40, r.IntN(10))
		for step := range 12 {
			name := fmt.Sprintf("seq %d step %d", seq, step)
			next := Next(plan, partitions, members)
			checkBalanced(t, next, partitions, members)
			// Determinism: shuffled and with duplicates, the same plan.
			shuffled := append(slices.Clone(members), members...)
			r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			if again := Next(plan, partitions, shuffled); again.Generation != next.Generation || !slices.Equal(again.Owners, next.Owners) {
				t.Fatalf("%s: members %v give %v, shuffled %v give %v", name, members, next, shuffled, again)
			}
			// Generation: bumped exactly on change.
			changed := !slices.Equal(plan.Owners, next.Owners)
			switch {
			case plan.Generation == 0 && !next.Assigned():
				if next.Generation != 0 {
					t.Fatalf("%s: a plan assigning nothing from none has generation %d", name, next.Generation)
				}
			case changed && next.Generation != plan.Generation+1, !changed && next.Generation != plan.Generation:
				t.Fatalf("%s: generation %d -> %d, owners changed %v", name, plan.Generation, next.Generation, changed)
			}
			// Stickiness: as many partitions keep their owner as balance
			// allows.
			if kept, best := keptOwners(plan, next), maxKeep(plan, partitions, members); kept != best {
				t.Fatalf("%s: %d partitions kept their owner, %d could: %v -> %v (members %v)", name, kept, best, plan.Owners, next.Owners, normalize(members))
			}
			// Fixed point.
			if fp := Next(next, partitions, members); fp.Generation != next.Generation || !slices.Equal(fp.Owners, next.Owners) {
				t.Fatalf("%s: not a fixed point: %v then %v", name, next, fp)
			}
			ms := normalize(members)
			if len(ms) > 0 && len(plan.Owners) == partitions && plan.Assigned() {
				checkJoinLeave(t, name, plan, partitions, ms, r)
			}
			plan = next
			// Evolve: join, leave, replace, or resize (rarely).
			switch k := r.IntN(10); {
			case k < 4:
				members = append(members, randomMembers(r, 40, 1)...)
			case k < 7 && len(members) > 0:
				i := r.IntN(len(members))
				members = slices.Delete(members, i, i+1)
			case k < 9:
				members = randomMembers(r, 40, r.IntN(10))
			default:
				partitions = 1 + r.IntN(64)
			}
		}
	}
}

// keptOwners counts the partitions of next that kept their owner in prev.
func keptOwners(prev, next Plan) int {
	n := 0
	for i := range min(len(prev.Owners), len(next.Owners)) {
		if prev.Owners[i] != "" && prev.Owners[i] == next.Owners[i] {
			n++
		}
	}
	return n
}

// maxKeep is the most partitions a balanced plan of members can leave with
// their owner in prev: each member keeps up to P/M, and P%M of those
// holding more keep one more.
func maxKeep(prev Plan, partitions int, members []string) int {
	ms := normalize(members)
	if len(ms) == 0 {
		return 0
	}
	held := map[string]int{}
	for i := range min(len(prev.Owners), partitions) {
		if slices.Contains(ms, prev.Owners[i]) {
			held[prev.Owners[i]]++
		}
	}
	base, extra := partitions/len(ms), partitions%len(ms)
	keep, over := 0, 0
	for _, m := range ms {
		keep += min(held[m], base)
		if held[m] > base {
			over++
		}
	}
	return keep + min(extra, over)
}

// checkJoinLeave checks, from a balanced plan of members ms, that one new
// member joining moves at most ceil(P/M) partitions (M with the new one),
// and that one member leaving moves its own partitions and at most
// ceil(P/M) others (M without it).
func checkJoinLeave(t *testing.T, name string, prev Plan, partitions int, ms []string, r *rand.Rand) {
	t.Helper()
	base := Next(prev, partitions, ms)
	joined := append(slices.Clone(ms), fmt.Sprintf("new%d", r.IntN(1000)))
	j := Next(base, partitions, joined)
	if n := moved(base.Owners, j.Owners); n > ceilDiv(partitions, len(joined)) {
		t.Fatalf("%s: a member joining %v moved %d partitions, more than ceil(%d/%d): %v -> %v", name, ms, n, partitions, len(joined), base.Owners, j.Owners)
	}
	if len(ms) < 2 {
		return
	}
	gone := ms[r.IntN(len(ms))]
	left := slices.DeleteFunc(slices.Clone(ms), func(m string) bool { return m == gone })
	l := Next(base, partitions, left)
	others := 0
	for i := range base.Owners {
		if base.Owners[i] != gone && base.Owners[i] != l.Owners[i] {
			others++
		}
	}
	if others > ceilDiv(partitions, len(left)) {
		t.Fatalf("%s: %s leaving moved %d of the others' partitions: %v -> %v", name, gone, others, base.Owners, l.Owners)
	}
}

func TestValidMemberID(t *testing.T) {
	for _, ok := range []string{"a", "billing-1", "host.example:4222_x", strings.Repeat("Z9", 64)} {
		if err := ValidMemberID(ok); err != nil {
			t.Errorf("ValidMemberID(%q) = %v", ok, err)
		}
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("a", 129), "a b", "a/b", "é", "a\x00", "a\n", "*"} {
		err := ValidMemberID(bad)
		if !errors.Is(err, ErrMemberID) {
			t.Errorf("ValidMemberID(%q) = %v, want ErrMemberID", bad, err)
		}
		if err != nil && len(err.Error()) > 200 {
			t.Errorf("ValidMemberID's error is %d bytes long", len(err.Error()))
		}
		if err := ValidName(bad); !errors.Is(err, ErrName) {
			t.Errorf("ValidName(%q) = %v, want ErrName", bad, err)
		}
	}
}

// BenchmarkNext plans 4,096 partitions over 64 members: a member joins a
// balanced plan (the changing case) and an unchanged plan is re-planned
// (the steady case), interleaved in the same run.
func BenchmarkNext(b *testing.B) {
	const partitions, members = 4096, 64
	ms := make([]string, members)
	for i := range ms {
		ms[i] = fmt.Sprintf("member-%02d.node-%d", i, i%5)
	}
	steady := Next(Plan{}, partitions, ms[:members-1])
	b.Run("join", func(b *testing.B) {
		for b.Loop() {
			_ = Next(steady, partitions, ms)
		}
	})
	b.Run("unchanged", func(b *testing.B) {
		for b.Loop() {
			_ = Next(steady, partitions, ms[:members-1])
		}
	})
}
