package kube

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
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
	x, err := NewPodIndex(PodIndexConfig{Client: client})
	if err != nil {
		t.Fatal(err)
	}
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
	if p := x.accounts.liveOf("apps", "web"); len(p) != 0 {
		t.Fatalf("a Pod being deleted renews: %+v", p)
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
