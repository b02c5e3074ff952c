package kube

import (
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// maxLookupNodes bounds the nodes whose lookup budgets are kept; past it
// the budgets start over (a cluster has far fewer nodes).
const maxLookupNodes = 16384

// LookupBudgetError is the refusal of a node's apiserver lookup: the node
// proxy of that node asked after more Pods the index did not hold than
// its share of the lookup rate allows. It is that node's alone: the
// lookups of other nodes go on.
type LookupBudgetError struct {
	Node string
	// RetryAfter is when the node's budget allows a lookup again.
	RetryAfter time.Duration
}

func (e *LookupBudgetError) Error() string {
	return fmt.Sprintf("kube: node %s has used its share of Pod lookups; one is allowed again in %v", e.Node, e.RetryAfter)
}

// nodeLookups gives each node its own share of the apiserver lookups
// that confirm the index's misses, so that one node proxy asking after
// Pods that do not exist (a compromised one, or a confused one) cannot
// spend the rate every node's misses share.
type nodeLookups struct {
	rate  rate.Limit
	burst int
	now   func() time.Time

	mu    sync.Mutex
	nodes map[string]*rate.Limiter
}

// newNodeLookups gives each node a quarter of total (per second), and a
// burst of total: a few nodes at most can use up the shared rate.
func newNodeLookups(total float64) *nodeLookups {
	return &nodeLookups{rate: rate.Limit(total / 4), burst: max(int(total), 1), now: time.Now, nodes: map[string]*rate.Limiter{}}
}

// take spends one of node's lookups, or says when one is allowed again.
func (n *nodeLookups) take(node string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	l, ok := n.nodes[node]
	if !ok {
		if len(n.nodes) >= maxLookupNodes {
			clear(n.nodes)
		}
		l = rate.NewLimiter(n.rate, n.burst)
		n.nodes[node] = l
	}
	now := n.now()
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		// Whole milliseconds, rounded up: the hint goes out as
		// grpc-retry-pushback-ms too, and must not be early.
		return &LookupBudgetError{Node: node, RetryAfter: (d + time.Millisecond - 1).Truncate(time.Millisecond)}
	}
	return nil
}
