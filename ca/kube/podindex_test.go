package kube

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func testPod(ns, name, uid, sa, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node}}
}

// TestPodIndex runs the index on a fake apiserver: the account index
// follows adds, updates and deletes; a Pod replaced under its name (new
// UID) and a deleted one are reported.
func TestPodIndex(t *testing.T) {
	const uidA, uidB = "0b6f3a2e-4c1d-4a7e-9f2b-000000000001", "0b6f3a2e-4c1d-4a7e-9f2b-000000000002"
	client := fake.NewClientset(testPod("apps", "web-0", uidA, "web", "node-a"), testPod("apps", "odd-0", "not-a-uuid", "odd", "node-b"))
	x := mustPodIndex(t, PodIndexConfig{Client: client})
	var mu sync.Mutex
	var gone []string
	x.OnDelete(func(p PodInfo) {
		mu.Lock()
		defer mu.Unlock()
		gone = append(gone, p.Namespace+"/"+p.Name+" "+p.UID)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "synced", x.Synced)

	onNode := x.accounts.liveOnNode
	sizes := func() (of, onNode int) {
		x.accounts.mu.RLock()
		defer x.accounts.mu.RUnlock()
		return len(x.accounts.of), len(x.accounts.onNode)
	}
	if p := onNode("apps", "web", "node-a"); len(p) != 1 || p[0].UID != uidA || p[0].Name != "web-0" {
		t.Fatalf("web on node-a: %+v", p)
	}
	if p := onNode("apps", "web", "node-b"); len(p) != 0 {
		t.Fatalf("web on node-b: %+v", p)
	}
	if p := x.accounts.liveOf("apps", "odd"); len(p) != 1 || p[0].UID != "not-a-uuid" {
		t.Fatalf("odd anywhere: %+v", p)
	}
	got, err := x.Pod(ctx, "apps", "web-0")
	if err != nil || got == nil || got.UID != uidA || got.ServiceAccount != "web" || got.Node != "node-a" {
		t.Fatalf("Pod: %+v %v", got, err)
	}
	// Indexed answers from the index alone: a miss asks no one.
	if p, ok := x.Indexed("apps", "web-0"); !ok || p.UID != uidA || p.ServiceAccount != "web" {
		t.Fatalf("Indexed: %+v %v", p, ok)
	}
	calls := len(client.Actions())
	if p, ok := x.Indexed("apps", "not-there"); ok || p != nil || len(client.Actions()) != calls {
		t.Fatalf("Indexed of a Pod not held: %+v %v, %d apiserver calls", p, ok, len(client.Actions())-calls)
	}

	// Moved to another node and replaced (a new UID) in one update, as a
	// relist after a missed delete sees it.
	moved := testPod("apps", "web-0", uidB, "web", "node-b")
	if _, err := client.CoreV1().Pods("apps").Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "moved", func() bool {
		return len(onNode("apps", "web", "node-b")) == 1 && len(onNode("apps", "web", "node-a")) == 0
	})
	// Terminated: not live, on any node; being deleted: live on its node
	// only (it drains), not for a renewal.
	failed := moved.DeepCopy()
	failed.Status.Phase = corev1.PodFailed
	if _, err := client.CoreV1().Pods("apps").Update(ctx, failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "failed", func() bool { return len(onNode("apps", "web", "node-b")) == 0 })
	deleting := moved.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if _, err := client.CoreV1().Pods("apps").Update(ctx, deleting, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleting", func() bool { return len(onNode("apps", "web", "node-b")) == 1 })
	if p := x.accounts.liveOf("apps", "web"); len(p) != 1 || !p[0].Deleting {
		t.Fatalf("a Pod being deleted, still draining: %+v, want it to renew", p)
	}
	if err := client.CoreV1().Pods("apps").Delete(ctx, "web-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "deleted", func() bool { of, _ := sizes(); return len(onNode("apps", "web", "node-b")) == 0 && of == 1 })
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"apps/web-0 " + uidA, "apps/web-0 " + uidB}; len(gone) != 2 || gone[0] != want[0] || gone[1] != want[1] {
		t.Fatalf("reported gone %q, want %q", gone, want)
	}
	if _, n := sizes(); n != 1 {
		t.Fatalf("index keeps %d node entries, want 1", n)
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// TestPodRecord: UUIDs are kept as 16 bytes and given back as written;
// anything else is kept as text; the informer sees the name, namespace,
// UID and resource version.
func TestPodRecord(t *testing.T) {
	for _, uid := range []string{"0b6f3a2e-4c1d-4a7e-9f2b-00000000abcd", "0B6F3A2E-4C1D-4A7E-9F2B-00000000ABCD", "", "x", "0b6f3a2e-4c1d-4a7e-9f2b-00000000abcg"} {
		p := testPod("ns", "name", uid, "sa", "node")
		p.ResourceVersion = "42"
		obj, _ := slimPod(p)
		r := obj.(*podRecord)
		if r.UID() != uid || (r.uidText == nil) != (uid == "0b6f3a2e-4c1d-4a7e-9f2b-00000000abcd") {
			t.Errorf("%q: got %q (as text: %v)", uid, r.UID(), r.uidText != nil)
		}
		m := r.GetObjectMeta()
		if m.GetNamespace() != "ns" || m.GetName() != "name" || string(m.GetUID()) != uid || m.GetResourceVersion() != "42" {
			t.Errorf("%q: object meta %+v", uid, m)
		}
		if c := r.DeepCopyObject().(*podRecord); *c != *r {
			t.Errorf("%q: copy %+v", uid, c)
		}
	}
}

// apiserverLists makes the Pod lists of client that carry a field
// selector answer as the apiserver does and the fake does not: only the
// Pods the selector matches, by name, up to the limit. lists counts them;
// when fail is set, they fail with it. (The fake runs its reactors under
// one lock: a reactor must not block.)
type apiserverLists struct {
	client *fake.Clientset
	lists  atomic.Int64
	fail   error
}

func newAPIServerLists(client *fake.Clientset) *apiserverLists {
	s := &apiserverLists{client: client}
	client.PrependReactor("list", "pods", s.react)
	return s
}

func (s *apiserverLists) react(a k8stesting.Action) (bool, runtime.Object, error) {
	la, ok := a.(k8stesting.ListActionImpl)
	if !ok || la.GetListRestrictions().Fields.Empty() {
		return false, nil, nil // the informer's own lists
	}
	s.lists.Add(1)
	if s.fail != nil {
		return true, nil, s.fail
	}
	obj, err := s.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), la.GetNamespace())
	if err != nil {
		return true, nil, err
	}
	all := obj.(*corev1.PodList).Items
	slices.SortFunc(all, func(p, q corev1.Pod) int { return strings.Compare(p.Name, q.Name) })
	out := &corev1.PodList{}
	for _, p := range all {
		f := fields.Set{"metadata.name": p.Name, "spec.nodeName": p.Spec.NodeName, "spec.serviceAccountName": p.Spec.ServiceAccountName,
			"status.phase": string(p.Status.Phase)}
		if la.GetListRestrictions().Fields.Matches(f) && (la.GetListOptions().Limit == 0 || int64(len(out.Items)) < la.GetListOptions().Limit) {
			out.Items = append(out.Items, p)
		}
	}
	return true, out, nil
}

func finishedPod(name string, phase corev1.PodPhase) *corev1.Pod {
	p := testPod("apps", name, "", "batch", "node-a")
	p.Status.Phase = phase
	return p
}

// TestAPIPodsFindsLiveBehindFinished: the apiserver fallback asks for Pods
// that have not finished, so that a Job's finished Pods, which stay until
// deleted, cannot fill its bounded list ahead of a live one.
func TestAPIPodsFindsLiveBehindFinished(t *testing.T) {
	var objs []runtime.Object
	for i := range 16 {
		phase := corev1.PodSucceeded
		if i%2 == 1 {
			phase = corev1.PodFailed
		}
		objs = append(objs, finishedPod(fmt.Sprintf("batch-%02d", i), phase))
	}
	objs = append(objs, finishedPod("batch-live", corev1.PodRunning))
	client := fake.NewClientset(objs...)
	newAPIServerLists(client)
	api := APIPods{Client: client}
	tests := []struct {
		name   string
		lookup func() ([]PodInfo, error)
	}{
		{"on a node", func() ([]PodInfo, error) { return api.OnNode(context.Background(), "apps", "batch", "node-a") }},
		{"of an account", func() ([]PodInfo, error) { return api.OfAccount(context.Background(), "apps", "batch") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods, err := tt.lookup()
			if err != nil || len(pods) != 1 || pods[0].Name != "batch-live" {
				t.Fatalf("got %+v, %v; want batch-live behind 16 finished Pods", pods, err)
			}
		})
	}
}

// runPodIndex runs x until the test ends, and waits for its first list.
func runPodIndex(t *testing.T, x *PodIndex) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "synced", x.Synced)
}

// TestPodIndexRemembersMisses: the apiserver's answer that an account (on
// a node) has no live Pod is given again for missTTL without another
// list; an error is not remembered, and a Pod the index gets is found at
// once.
func TestPodIndexRemembersMisses(t *testing.T) {
	const uid = "0b6f3a2e-4c1d-4a7e-9f2b-000000000003"
	type step struct {
		of, on  string        // "ns/sa" asked of OfAccount, or "ns/sa/node" of OnNode
		after   time.Duration // the clock moves on this much first
		add     *corev1.Pod   // created first, and waited for in the index
		fail    bool          // the list fails
		want    int           // Pods found
		wantErr bool
	}
	tests := []struct {
		name  string
		steps []step
		lists int64
	}{
		{name: "a gone account, asked again and again", lists: 1,
			steps: []step{{of: "old/deleted"}, {of: "old/deleted"}, {of: "old/deleted", after: missTTL - time.Second}}},
		{name: "asked again after missTTL", lists: 2, steps: []step{{of: "old/deleted"}, {of: "old/deleted", after: missTTL}}},
		{name: "another account", lists: 2, steps: []step{{of: "old/deleted"}, {of: "old/other"}}},
		// A node proxy's misses are not remembered: a Pod scheduled on its
		// node a moment later must not wait out missTTL.
		{name: "on a node, asked again", lists: 3,
			steps: []step{{on: "old/deleted/node-a"}, {on: "old/deleted/node-a"}, {on: "old/deleted/node-b"}}},
		{name: "an account, then on a node", lists: 2, steps: []step{{of: "old/deleted"}, {on: "old/deleted/node-a"}}},
		{name: "an apiserver that fails is asked again", lists: 2, steps: []step{{of: "old/deleted", fail: true, wantErr: true}, {of: "old/deleted"}}},
		{name: "a Pod the index gets is found at once", lists: 1,
			steps: []step{{of: "old/deleted"}, {add: testPod("old", "back-0", uid, "deleted", "node-a"), of: "old/deleted", want: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset(testPod("apps", "web-0", uid, "web", "node-a"))
			api := newAPIServerLists(client)
			x := mustPodIndex(t, PodIndexConfig{Client: client})
			clk := &fakeClock{now: time.Unix(1e9, 0)}
			x.misses.now = clk.Now
			runPodIndex(t, x)
			ctx := context.Background()
			for i, st := range tt.steps {
				clk.Add(st.after)
				if st.add != nil {
					if _, err := client.CoreV1().Pods(st.add.Namespace).Create(ctx, st.add, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
					eventually(t, "added", func() bool { return len(x.accounts.liveOf(st.add.Namespace, st.add.Spec.ServiceAccountName)) == 1 })
				}
				api.fail = nil
				if st.fail {
					api.fail = errors.New("connection refused")
				}
				var (
					pods []PodInfo
					err  error
				)
				if st.of != "" {
					ns, sa, _ := strings.Cut(st.of, "/")
					pods, err = x.OfAccount(ctx, ns, sa)
				} else {
					parts := strings.Split(st.on, "/")
					pods, err = x.OnNode(ctx, parts[0], parts[1], parts[2])
				}
				if (err != nil) != st.wantErr || len(pods) != st.want {
					t.Fatalf("step %d: %d Pods, %v; want %d (error: %v)", i+1, len(pods), err, st.want, st.wantErr)
				}
			}
			if n := api.lists.Load(); n != tt.lists {
				t.Fatalf("%d lists, want %d", n, tt.lists)
			}
		})
	}
}

// TestPodIndexMissesShareOneList: concurrent misses of one account share
// one list, so that a still-valid certificate of a deleted workload,
// renewing from many connections at once, cannot use up the lookup limiter
// that every other miss shares.
func TestPodIndexMissesShareOneList(t *testing.T) {
	client := fake.NewClientset()
	api := newAPIServerLists(client)
	x := mustPodIndex(t, PodIndexConfig{Client: client, LookupRate: 1}) // bursts of 4
	runPodIndex(t, x)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if pods, err := x.OfAccount(ctx, "old", "deleted"); err != nil || len(pods) != 0 {
				t.Errorf("the gone account: %+v, %v; want no Pod", pods, err)
			}
		})
	}
	eventually(t, "the gone account listed", func() bool { return api.lists.Load() > 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := x.Pod(ctx, "apps", "web-new"); err != nil {
		t.Errorf("another caller's lookup: %v, want an answer", err)
	}
	wg.Wait()
	if n := api.lists.Load(); n != 1 {
		t.Errorf("20 concurrent misses of one account made %d lists, want 1", n)
	}
}

// TestPodIndexMissOutlivesFirstDeadline: the list that confirms a miss
// runs under a bound of its own, not its first caller's deadline. With the
// lookup limiter empty, a first caller with a short deadline leaves with
// its own deadline's error (under that deadline, the limiter refused the
// list at once, for every caller sharing it), while the list waits for
// its turn and answers a second caller, the two sharing it.
func TestPodIndexMissOutlivesFirstDeadline(t *testing.T) {
	client := fake.NewClientset()
	api := newAPIServerLists(client)
	x := mustPodIndex(t, PodIndexConfig{Client: client, LookupRate: 2}) // bursts of 8, then one each 500 ms
	runPodIndex(t, x)
	for i := range 8 { // empty the limiter
		if _, err := x.OfAccount(context.Background(), "old", fmt.Sprintf("gone-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := x.OfAccount(short, "old", "deleted"); first <- err }()
	time.Sleep(10 * time.Millisecond) // the first caller starts the list
	long, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if pods, err := x.OfAccount(long, "old", "deleted"); err != nil || len(pods) != 0 {
		t.Errorf("the second caller: %+v, %v; want no Pod and no error", pods, err)
	}
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the first caller: %v, want its own deadline", err)
	}
	if n := api.lists.Load(); n != 9 {
		t.Errorf("%d lists, want 9: the two callers share one", n)
	}
}

// TestPodMissesBounded: past maxMisses, the oldest misses are forgotten.
func TestPodMissesBounded(t *testing.T) {
	m := newPodMisses()
	for i := range maxMisses + 100 {
		m.put(missKey("of", "ns", fmt.Sprint(i)))
	}
	if n := m.fifo.Len(); n != maxMisses || len(m.byKey) != maxMisses {
		t.Fatalf("%d misses kept (%d keys), want %d", n, len(m.byKey), maxMisses)
	}
	if m.known(missKey("of", "ns", "0")) || !m.known(missKey("of", "ns", fmt.Sprint(maxMisses+99))) {
		t.Fatal("kept the oldest misses, not the newest")
	}
}

// mustPodIndex builds an index on cfg or ends the test.
func mustPodIndex(t *testing.T, cfg PodIndexConfig) *PodIndex {
	t.Helper()
	x, err := NewPodIndex(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x
}
