package trust_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshca/meshca/ca/trust"
)

func namespace(name string, lbls map[string]string, terminating bool) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
	if terminating {
		ns.Status.Phase = corev1.NamespaceTerminating
	}
	return ns
}

func TestNewPublisherRefuses(t *testing.T) {
	client := fake.NewClientset()
	bundle := pemOnly("pem")
	for name, c := range map[string]trust.Config{
		"no client":        {Bundle: bundle},
		"no bundle":        {Client: client},
		"negative resync":  {Client: client, Bundle: bundle, Resync: -time.Second},
		"negative workers": {Client: client, Bundle: bundle, Workers: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := trust.NewPublisher(c); err == nil {
				t.Fatal("want an error")
			}
		})
	}
}

func TestWants(t *testing.T) {
	sel := labels.SelectorFromSet(labels.Set{"mesh": "on"})
	deleting := namespace("going", nil, false)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	for _, tc := range []struct {
		name     string
		selector labels.Selector
		ns       *corev1.Namespace
		want     bool
	}{
		{"plain", nil, namespace("apps", nil, false), true},
		{"kube-system: ztunnel may run there", nil, namespace("kube-system", nil, false), true},
		{"kube-public", nil, namespace("kube-public", nil, false), false},
		{"kube-node-lease", nil, namespace("kube-node-lease", nil, false), false},
		{"skipped by config", nil, namespace("infra", nil, false), false},
		{"terminating phase", nil, namespace("apps", nil, true), false},
		{"deletion timestamp", nil, deleting, false},
		{"selector matches", sel, namespace("apps", map[string]string{"mesh": "on"}, false), true},
		{"selector does not match", sel, namespace("apps", map[string]string{"mesh": "off"}, false), false},
		{"selector, no labels", sel, namespace("apps", nil, false), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := trust.NewPublisher(trust.Config{Client: fake.NewClientset(),
				Bundle: pemOnly(""), Selector: tc.selector, Skip: []string{"infra"}})
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Wants(tc.ns); got != tc.want {
				t.Errorf("Wants = %v, want %v", got, tc.want)
			}
		})
	}
}

// counter is a trust.Observer.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) ObserveWrite(r string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[r]++
}

func (c *counter) get(r string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[r]
}

// bundle is a trust bundle that tests change.
type bundle struct{ v atomic.Value }

func (b *bundle) set(s string) { b.setVersioned(s, trust.BundleVersion{}) }
func (b *bundle) setVersioned(s string, v trust.BundleVersion) {
	b.v.Store(trust.Bundle{PEM: []byte(s), Version: v})
}
func (b *bundle) get() trust.Bundle { v, _ := b.v.Load().(trust.Bundle); return v }

// pemOnly is a Config.Bundle of pem, with no version.
func pemOnly(pem string) func() trust.Bundle {
	return func() trust.Bundle { return trust.Bundle{PEM: []byte(pem)} }
}

func start(t *testing.T, c trust.Config) *trust.Publisher {
	t.Helper()
	p, err := trust.NewPublisher(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return p
}

// eventually polls cond until it holds or 5 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func configMap(client kubernetes.Interface, ns string) *corev1.ConfigMap {
	cm, err := client.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return cm
}

func published(client kubernetes.Interface, ns, pem string) func() bool {
	return func() bool {
		cm := configMap(client, ns)
		return cm != nil && cm.Data[trust.DataKey] == pem && cm.Labels[trust.LabelKey] == trust.LabelValue
	}
}

func TestPublisherLifecycle(t *testing.T) {
	client := fake.NewClientset(
		namespace("a", nil, false), namespace("b", nil, false),
		namespace("kube-system", nil, false), namespace("dying", nil, true),
		namespace("infra", nil, false))
	var b bundle
	b.set("root-1")
	obs := &counter{}
	p := start(t, trust.Config{Client: client, Bundle: b.get, Skip: []string{"infra"}, Observer: obs})
	ctx := context.Background()

	for _, ns := range []string{"a", "b", "kube-system"} {
		eventually(t, "created in "+ns, published(client, ns, "root-1"))
	}

	_, err := client.CoreV1().Namespaces().Create(ctx, namespace("c", nil, false), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "created in a new namespace", published(client, "c", "root-1"))

	b.set("root-1\nroot-2")
	p.BundleChanged()
	for _, ns := range []string{"a", "b", "c"} {
		eventually(t, "updated in "+ns, published(client, ns, "root-1\nroot-2"))
	}

	cm := configMap(client, "a")
	cm.Data[trust.DataKey] = "tampered"
	cm.Data["extra"] = "dropped"
	if _, err := client.CoreV1().ConfigMaps("a").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "data repaired", published(client, "a", "root-1\nroot-2"))
	if got, ok := configMap(client, "a").Data["extra"]; ok {
		t.Errorf("a key meshca did not write was kept: extra=%q", got)
	}

	cm = configMap(client, "b")
	delete(cm.Labels, trust.LabelKey)
	if _, err := client.CoreV1().ConfigMaps("b").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "label repaired", published(client, "b", "root-1\nroot-2"))

	if err := client.CoreV1().ConfigMaps("c").Delete(ctx, trust.ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "recreated", published(client, "c", "root-1\nroot-2"))

	for _, ns := range []string{"dying", "infra"} {
		if configMap(client, ns) != nil {
			t.Errorf("%s: ConfigMap written into a skipped namespace", ns)
		}
	}
	if got := obs.get(trust.ResultCreated); got != 5 {
		t.Errorf("created %d times, want 5 (a, b, kube-system, c, c again)", got)
	}
	// 4 bundle changes and 2 repairs; a repair may be written twice when
	// another event reaches the publisher before its informer has seen
	// its own write (a busy machine): the end state above is what
	// counts, and the bound, that nothing keeps writing.
	if got := obs.get(trust.ResultUpdated); got < 6 || got > 8 {
		t.Errorf("updated %d times, want 6 (4 bundle changes, 2 repairs), or up to 2 more", got)
	}
}

func TestPublisherWritesNothingWhenEqual(t *testing.T) {
	existing := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a",
			Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
		Data: map[string]string{trust.DataKey: "root-1"},
	}
	client := fake.NewClientset(namespace("a", nil, false), existing)
	var writes atomic.Int32
	client.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() == "create" || a.GetVerb() == "update" {
			writes.Add(1)
		}
		return false, nil, nil
	})
	p := start(t, trust.Config{Client: client, Bundle: pemOnly("root-1")})
	p.BundleChanged()
	time.Sleep(300 * time.Millisecond)
	if n := writes.Load(); n != 0 {
		t.Errorf("%d writes of an up-to-date ConfigMap", n)
	}
}

func TestPublisherEmptyBundleWritesNothing(t *testing.T) {
	client := fake.NewClientset(namespace("a", nil, false))
	start(t, trust.Config{Client: client, Bundle: pemOnly("")})
	time.Sleep(300 * time.Millisecond)
	if configMap(client, "a") != nil {
		t.Error("an empty bundle was published")
	}
}

func TestPublisherRetriesConflicts(t *testing.T) {
	existing := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a"},
		Data:       map[string]string{trust.DataKey: "old"},
	}
	client := fake.NewClientset(namespace("a", nil, false), existing)
	var conflicts atomic.Int32
	client.PrependReactor("update", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts.Add(1) <= 2 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"},
				trust.ConfigMapName, errors.New("stale"))
		}
		return false, nil, nil
	})
	obs := &counter{}
	start(t, trust.Config{Client: client, Bundle: pemOnly("new"), Observer: obs})
	eventually(t, "updated after conflicts", published(client, "a", "new"))
	if got := obs.get(trust.ResultConflict); got != 2 {
		t.Errorf("conflicts observed %d, want 2", got)
	}
}

func TestPublisherSelector(t *testing.T) {
	client := fake.NewClientset(
		namespace("in", map[string]string{"mesh": "on"}, false),
		namespace("out", nil, false))
	start(t, trust.Config{Client: client, Bundle: pemOnly("root"),
		Selector: labels.SelectorFromSet(labels.Set{"mesh": "on"})})
	eventually(t, "published in the selected namespace", published(client, "in", "root"))

	ns, _ := client.CoreV1().Namespaces().Get(context.Background(), "out", metav1.GetOptions{})
	if configMap(client, "out") != nil {
		t.Fatal("published in a namespace the selector does not match")
	}
	ns.Labels = map[string]string{"mesh": "on"}
	if _, err := client.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "published once the namespace is labelled", published(client, "out", "root"))
}

func TestRunTwice(t *testing.T) {
	p := start(t, trust.Config{Client: fake.NewClientset(), Bundle: pemOnly("")})
	time.Sleep(50 * time.Millisecond)
	if err := p.Run(context.Background()); err == nil {
		t.Error("second Run: want an error")
	}
}
