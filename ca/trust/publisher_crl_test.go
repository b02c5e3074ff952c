package trust_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshca/meshca/ca/trust"
)

// crlMap reads the istio-ca-crl ConfigMap of ns from the fake apiserver;
// nil when there is none.
func crlMap(client *fake.Clientset, ns string) *corev1.ConfigMap {
	obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("configmaps"), ns, trust.CRLConfigMapName)
	if err != nil {
		return nil
	}
	return obj.(*corev1.ConfigMap)
}

// hearing records what Config.Published heard, in order.
type hearing struct {
	mu  sync.Mutex
	got []string
}

func (p *hearing) hear(pem []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pem == nil {
		p.got = append(p.got, "<nil>")
		return
	}
	p.got = append(p.got, string(pem))
}

func (p *hearing) last() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) == 0 {
		return ""
	}
	return p.got[len(p.got)-1]
}

// TestPublisherCRLDocument: a Publisher of CRLDocument keeps istio-ca-crl
// (ca-crl.pem alone) in every selected namespace by the same rules as the
// trust bundle's: created, a tenant's edit repaired, a skipped namespace
// and every other ConfigMap (istio-ca-root-cert among them) untouched;
// an empty bundle writes nothing and leaves what is published.
func TestPublisherCRLDocument(t *testing.T) {
	tenantRoot := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a"},
		Data: map[string]string{trust.DataKey: "tenant's roots"}}
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "my-crl", Namespace: "a"},
		Data: map[string]string{trust.CRLDataKey: "tenant's crl"}}
	skippedCRL := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: trust.CRLConfigMapName, Namespace: "infra"},
		Data: map[string]string{trust.CRLDataKey: "someone else's"}}
	client := fake.NewClientset(namespace("a", nil, false), namespace("b", nil, false), namespace("infra", nil, false),
		tenantRoot, other, skippedCRL)
	var b bundle
	b.set("crl-1")
	var heard hearing
	obs := &counter{}
	p := start(t, trust.Config{Client: client, Document: trust.CRLDocument, Bundle: b.get, Skip: []string{"infra"},
		Observer: obs, Published: heard.hear})

	only := func(ns, pem string) func() bool {
		return func() bool {
			cm := crlMap(client, ns)
			return cm != nil && maps.Equal(cm.Data, map[string]string{trust.CRLDataKey: pem}) &&
				cm.Labels[trust.LabelKey] == trust.LabelValue
		}
	}
	eventually(t, "istio-ca-crl in a and b", func() bool { return only("a", "crl-1")() && only("b", "crl-1")() })
	if heard.last() != "crl-1" {
		t.Errorf("Published heard %q, want crl-1", heard.last())
	}
	p.BundleChanged()
	time.Sleep(300 * time.Millisecond) // a write of what is current would show by now
	if n := obs.get(trust.ResultUpdated); n != 0 {
		t.Errorf("%d updates of current ConfigMaps, want 0", n)
	}

	// A tenant edits its namespace's CRL: repaired.
	cm := crlMap(client, "a").DeepCopy()
	cm.Data[trust.CRLDataKey] = "nothing revoked here"
	cm.Data["extra"] = "x"
	if _, err := client.CoreV1().ConfigMaps("a").Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the tenant's edit repaired", only("a", "crl-1"))

	// A new CRL reaches every namespace.
	b.set("crl-2")
	p.BundleChanged()
	eventually(t, "crl-2 everywhere", func() bool { return only("a", "crl-2")() && only("b", "crl-2")() })

	// An empty bundle writes nothing new and leaves what is published.
	b.set("")
	p.BundleChanged()
	if err := client.CoreV1().Namespaces().Delete(context.Background(), "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), namespace("c", nil, false), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !only("a", "crl-2")() {
		t.Errorf("an empty bundle changed a's CRL: %+v", crlMap(client, "a"))
	}
	if cm := crlMap(client, "c"); cm != nil {
		t.Errorf("an empty bundle was published to c: %+v", cm)
	}

	for _, c := range []*corev1.ConfigMap{tenantRoot, other, skippedCRL} {
		obj, err := client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("configmaps"), c.Namespace, c.Name)
		if err != nil {
			t.Fatalf("%s/%s: %v", c.Namespace, c.Name, err)
		}
		if got := obj.(*corev1.ConfigMap); !maps.Equal(got.Data, c.Data) || len(got.Labels) != 0 {
			t.Errorf("%s/%s touched: %+v", c.Namespace, c.Name, got)
		}
	}
	if n := obs.get(trust.ResultCreated); n != 2 {
		t.Errorf("%d creates, want 2", n)
	}
}

// TestPublisherPublishedEndsWithTerm: Published hears nil when Run
// returns, so that what this replica reports published ends with its
// term.
func TestPublisherPublishedEndsWithTerm(t *testing.T) {
	client := fake.NewClientset(namespace("a", nil, false))
	var heard hearing
	p, err := trust.NewPublisher(trust.Config{Client: client, Document: trust.CRLDocument,
		Bundle: pemOnly("crl"), Published: heard.hear})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	eventually(t, "published", func() bool { return heard.last() == "crl" })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if heard.last() != "<nil>" {
		t.Errorf("after Run: %q, want <nil>", heard.last())
	}
}

func TestNewPublisherRefusesHalfADocument(t *testing.T) {
	for _, d := range []trust.Document{{Name: "x"}, {Key: "x.pem"}} {
		_, err := trust.NewPublisher(trust.Config{Client: fake.NewClientset(), Bundle: pemOnly("p"), Document: d})
		if err == nil {
			t.Errorf("%+v: want an error", d)
		}
	}
}
