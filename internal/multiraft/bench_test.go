package multiraft

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkClusterTick measures one tick of a 3-node cluster in simulated
// time (every host ticks, flushes, and the network delivers) with n groups
// on every node. groups of one are always quiet; three-idle are groups of
// three that Quiescence has made quiet; three-ticking are the same groups
// kept ticking (heartbeats every tick), the cost without quiescence. The
// figure per group is ns/op divided by 3n replicas.
func BenchmarkClusterTick(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		for _, mode := range []string{"one", "three-idle", "three-ticking"} {
			b.Run(fmt.Sprintf("groups=%d/%s", n, mode), func(b *testing.B) {
				s := newSim(b, 1, 3, Faults{})
				s.noQuiesce = mode == "three-ticking"
				for g := uint64(1); g <= uint64(n); g++ {
					if mode == "one" {
						s.addGroup(g, []uint64{1 + g%3})
					} else {
						s.addGroup(g, []uint64{1, 2, 3})
					}
				}
				s.run(5 * time.Second) // elect, then go quiet
				t0, sent0, _ := sumStats(s)
				b.ResetTimer()
				for b.Loop() {
					s.run(tickEvery)
				}
				b.StopTimer()
				t1, sent1, _ := sumStats(s)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(3*n), "ns/replica")
				b.ReportMetric(float64(t1-t0)/float64(b.N), "groupticks/op")
				b.ReportMetric(float64(sent1-sent0)/float64(b.N), "msgs/op")
			})
		}
	}
}
