package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestNodeLookups: each node has its own burst and rate, refusals say
// when to retry, and the kept budgets are bounded.
func TestNodeLookups(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1e9, 0)}
	n := newNodeLookups(20) // 5/s a node, bursts of 20
	n.now = clk.Now
	for i := range 20 {
		if err := n.take("node-a"); err != nil {
			t.Fatalf("lookup %d of node-a's burst: %v", i+1, err)
		}
	}
	var be *LookupBudgetError
	if err := n.take("node-a"); !errors.As(err, &be) || be.Node != "node-a" || be.RetryAfter != 200*time.Millisecond {
		t.Fatalf("past node-a's burst: %v, want a LookupBudgetError with a retry in 200ms", err)
	}
	clk.Add(1500 * time.Microsecond) // a hint is rounded up: never a retry too early
	if err := n.take("node-a"); !errors.As(err, &be) || be.RetryAfter != 199*time.Millisecond {
		t.Fatalf("1.5ms later: %v, want a retry in 199ms (198.5ms rounded up)", err)
	}
	if err := n.take("node-b"); err != nil {
		t.Fatalf("node-b, after node-a spent its burst: %v", err)
	}
	clk.Add(200 * time.Millisecond)
	if err := n.take("node-a"); err != nil {
		t.Fatalf("node-a after its retry hint: %v", err)
	}
	for i := range maxLookupNodes + 10 {
		_ = n.take(fmt.Sprint("node-", i))
	}
	if len(n.nodes) > maxLookupNodes {
		t.Fatalf("%d node budgets kept, want at most %d", len(n.nodes), maxLookupNodes)
	}
}

// TestPodIndexNodeShare: a node proxy asking after Pods its node does not
// run (each a miss, each a list) is refused past its node's share, and
// the lookups of another node go on within a short deadline.
func TestPodIndexNodeShare(t *testing.T) {
	client := fake.NewClientset()
	api := newAPIServerLists(client)
	x := mustPodIndex(t, PodIndexConfig{Client: client}) // 20/s, bursts of 80; a node 5/s, bursts of 20
	runPodIndex(t, x)
	var refused int
	for i := range 100 {
		_, err := x.OnNode(context.Background(), "apps", fmt.Sprint("made-up-", i), "node-a")
		var be *LookupBudgetError
		switch {
		case errors.As(err, &be):
			refused++
		case err != nil:
			t.Fatalf("miss %d of node-a: %v", i, err)
		}
	}
	if refused < 75 || api.lists.Load() > 25 {
		t.Fatalf("node-a: %d of 100 misses refused, %d lists; want its burst of 20 (and what 5/s adds) only", refused, api.lists.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := x.OnNode(ctx, "apps", "new", "node-b"); err != nil {
		t.Fatalf("node-b after node-a's misses: %v, want an answer within 30ms", err)
	}
}

// TestPodIndexPodMissesShareOneGet: concurrent misses of one Pod name
// share one apiserver GET.
func TestPodIndexPodMissesShareOneGet(t *testing.T) {
	client := fake.NewClientset()
	var gets atomic.Int64
	gate := make(chan struct{})
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets.Add(1)
		<-gate
		return false, nil, nil
	})
	x := mustPodIndex(t, PodIndexConfig{Client: client})
	runPodIndex(t, x)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if p, err := x.Pod(context.Background(), "apps", "gone-0"); p != nil || err != nil {
				t.Errorf("a deleted Pod: %+v, %v; want none", p, err)
			}
		})
	}
	eventually(t, "the GET started", func() bool { return gets.Load() > 0 })
	time.Sleep(50 * time.Millisecond) // the others join it
	close(gate)
	wg.Wait()
	if n := gets.Load(); n != 1 {
		t.Fatalf("20 concurrent misses of one Pod made %d GETs, want 1", n)
	}
}
