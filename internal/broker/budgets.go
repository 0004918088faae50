package broker

import "github.com/sinewmq/sinew/internal/budget"

// Node-wide cache budgets, shared by every partition the broker opens
// (internal/budget).
const (
	// BodyCacheBytesDefault is Config.BodyCacheBytes when left zero.
	BodyCacheBytesDefault = 16 << 20
	// RaftCacheBytesDefault is Config.RaftCacheBytes when left zero.
	RaftCacheBytesDefault = 32 << 20
)

// Budget names, as /api/v1/overview and /metrics show them.
const (
	BudgetBodyCache = "body_cache"
	BudgetRaftCache = "raft_cache"
)

// nodeBudgets are the broker's budgets; body is nil when the body cache is
// off.
type nodeBudgets struct {
	body, raft *budget.Budget
}

func newNodeBudgets(cfg *Config) nodeBudgets {
	var nb nodeBudgets
	switch {
	case cfg.BodyCacheBytes == 0:
		nb.body = budget.New(BudgetBodyCache, BodyCacheBytesDefault)
	case cfg.BodyCacheBytes > 0:
		nb.body = budget.New(BudgetBodyCache, int64(cfg.BodyCacheBytes))
	}
	raft := int64(cfg.RaftCacheBytes)
	if raft <= 0 {
		raft = RaftCacheBytesDefault
	}
	nb.raft = budget.New(BudgetRaftCache, raft)
	return nb
}

// BudgetStats is one node-wide memory budget now.
type BudgetStats struct {
	Name string
	// Limit is the budget's bound and Used what its caches reserved
	// (at most one small chunk per partition above what they hold).
	Limit, Used int64
	// Evicted counts the bytes given back under pressure since Open.
	Evicted int64
}

// Budgets returns the node-wide memory budgets: body_cache (absent when the
// body cache is off) and raft_cache.
func (b *Broker) Budgets() []BudgetStats {
	var out []BudgetStats
	for _, bud := range []*budget.Budget{b.budgets.body, b.budgets.raft} {
		if bud != nil {
			out = append(out, BudgetStats{Name: bud.Name(), Limit: bud.Limit(), Used: bud.Used(), Evicted: bud.Evicted()})
		}
	}
	return out
}
