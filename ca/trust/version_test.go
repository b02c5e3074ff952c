package trust_test

import (
	"context"
	"errors"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/meshca/meshca/ca/trust"
)

// versioned are the annotations of a bundle of lineage at seq.
func versioned(lineage, seq string) map[string]string {
	return map[string]string{trust.AnnotationLineage: lineage, trust.AnnotationSequence: seq, "team": "kept"}
}

// runTerm runs run (a publisher's Run, one term of leadership) and
// returns what it returns; the test's end stops it.
func runTerm(t *testing.T, run func(context.Context) error) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(cancel)
	return done
}

// stepsDown waits for a term to end by itself with trust.ErrStale.
func stepsDown(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, trust.ErrStale) {
			t.Fatalf("Run: %v, want it to step down with ErrStale", err)
		}
	case <-time.After(trust.StaleGrace + 5*time.Second):
		t.Fatal("a publisher behind the published bundle did not step down")
	}
}

// TestPublisherBundleVersions: a replica whose CA state is older than
// the one published (the same lineage, a lower sequence) does not write
// over it, counts it stale, says so once and steps down (its Run returns
// ErrStale); once it has caught up, its next term writes. A bundle of another lineage, or one with no version (pinned
// anchors), is written over whatever is published. Other annotations are
// kept.
func TestPublisherBundleVersions(t *testing.T) {
	for _, tc := range []struct {
		name        string
		published   map[string]string
		ours        trust.BundleVersion
		written     bool
		annotations map[string]string // after
	}{
		{"older of the same lineage", versioned("L", "5"), trust.BundleVersion{Lineage: "L", Sequence: 3}, false, versioned("L", "5")},
		{"equal of the same lineage", versioned("L", "5"), trust.BundleVersion{Lineage: "L", Sequence: 5}, true, versioned("L", "5")},
		{"newer of the same lineage", versioned("L", "5"), trust.BundleVersion{Lineage: "L", Sequence: 6}, true, versioned("L", "6")},
		{"another lineage", versioned("M", "9"), trust.BundleVersion{Lineage: "L", Sequence: 1}, true, versioned("L", "1")},
		{"published without a version", map[string]string{"team": "kept"}, trust.BundleVersion{Lineage: "L", Sequence: 1}, true, versioned("L", "1")},
		{"unreadable sequence", versioned("L", "x"), trust.BundleVersion{Lineage: "L", Sequence: 1}, true, versioned("L", "1")},
		{"ours without a version", versioned("L", "5"), trust.BundleVersion{}, true, map[string]string{"team": "kept"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			existing := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a", Annotations: tc.published,
					Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
				Data: map[string]string{trust.DataKey: "published"},
			}
			client := fake.NewClientset(namespace("a", nil, false), existing)
			obs, l := &counter{}, &logs{}
			b := &bundle{}
			b.setVersioned("ours", tc.ours)
			newTerm := func() func(context.Context) error {
				p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get, Observer: obs, Logger: l.logger()})
				if err != nil {
					t.Fatal(err)
				}
				return p.Run
			}
			term := runTerm(t, newTerm())
			if tc.written {
				eventually(t, "our bundle written", published(client, "a", "ours"))
			} else {
				stepsDown(t, term)
				if got := configMap(client, "a").Data[trust.DataKey]; got != "published" {
					t.Fatalf("an older bundle was written over a newer one: %q", got)
				}
				if obs.get(trust.ResultStale) == 0 || l.count("newer than this replica") != 1 {
					t.Errorf("stale writes %d, log:\n%s; want counted and said once", obs.get(trust.ResultStale), l.buf.String())
				}
				// Caught up: the next term writes.
				b.setVersioned("caught up", trust.BundleVersion{Lineage: "L", Sequence: 7})
				runTerm(t, newTerm())
				eventually(t, "written once caught up", published(client, "a", "caught up"))
				tc.annotations = versioned("L", "7")
			}
			if got := configMap(client, "a").Annotations; !equalMaps(got, tc.annotations) {
				t.Errorf("annotations %v, want %v", got, tc.annotations)
			}
		})
	}
}

// TestPublisherCreatesNothingWhenBehind: a newer bundle published in one
// namespace keeps a replica behind it from creating its older bundle in
// another: it steps down, and its next term, caught up, writes both.
func TestPublisherCreatesNothingWhenBehind(t *testing.T) {
	existing := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a", Annotations: versioned("L", "5"),
			Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
		Data: map[string]string{trust.DataKey: "published"},
	}
	client := fake.NewClientset(namespace("a", nil, false), namespace("b", nil, false), existing)
	b := &bundle{}
	b.setVersioned("older", trust.BundleVersion{Lineage: "L", Sequence: 4})
	newTerm := func() func(context.Context) error {
		p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get})
		if err != nil {
			t.Fatal(err)
		}
		return p.Run
	}
	stepsDown(t, runTerm(t, newTerm()))
	if cm := configMap(client, "b"); cm != nil {
		t.Fatalf("created the older bundle in a new namespace: %q", cm.Data[trust.DataKey])
	}
	b.setVersioned("newer", trust.BundleVersion{Lineage: "L", Sequence: 6})
	runTerm(t, newTerm())
	eventually(t, "written in a", published(client, "a", "newer"))
	eventually(t, "created in b", published(client, "b", "newer"))
}

// TestPublisherCatchesUpWithinGrace: a replica a moment behind (its CA
// state catches up within trust.StaleGrace) does not step down: it writes
// the bundle once it has it.
func TestPublisherCatchesUpWithinGrace(t *testing.T) {
	existing := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a", Annotations: versioned("L", "5"),
			Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
		Data: map[string]string{trust.DataKey: "published"},
	}
	client := fake.NewClientset(namespace("a", nil, false), existing)
	obs := &counter{}
	b := &bundle{}
	b.setVersioned("behind", trust.BundleVersion{Lineage: "L", Sequence: 4})
	p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	term := runTerm(t, p.Run)
	eventually(t, "found stale", func() bool { return obs.get(trust.ResultStale) > 0 })
	b.setVersioned("caught up", trust.BundleVersion{Lineage: "L", Sequence: 5})
	p.BundleChanged() // as meshca serve does on every CA state it puts in service
	eventually(t, "written once caught up", published(client, "a", "caught up"))
	select {
	case err := <-term:
		t.Fatalf("stepped down (%v) although it caught up within the grace", err)
	case <-time.After(trust.StaleGrace + time.Second):
	}
}

// TestClusterTrustBundleBundleVersions: the ClusterTrustBundle publisher
// keeps the same rule.
func TestClusterTrustBundleBundleVersions(t *testing.T) {
	existing := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-cluster.local", Labels: map[string]string{trust.LabelManagedBy: trust.ManagedBy},
			Annotations: versioned("L", "5")},
		Spec: certv1.ClusterTrustBundleSpec{TrustBundle: "published"},
	}
	client := fake.NewClientset(existing)
	obs := &counter{}
	b := &bundle{}
	b.setVersioned("older", trust.BundleVersion{Lineage: "L", Sequence: 4})
	newTerm := func() func(context.Context) error {
		p, err := trust.NewClusterTrustBundlePublisher(trust.ClusterTrustBundleConfig{Client: client, TrustDomain: testTD,
			Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}}, Bundle: b.get, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		return p.Run
	}
	stepsDown(t, runTerm(t, newTerm()))
	if got := ctb(client, existing.Name).Spec.TrustBundle; got != "published" || obs.get(trust.ResultStale) == 0 {
		t.Fatalf("an older bundle was written over a newer one (%q), or not counted stale", got)
	}
	b.setVersioned("newer", trust.BundleVersion{Lineage: "L", Sequence: 6})
	runTerm(t, newTerm())
	eventually(t, "written once caught up", holds(client, existing.Name, "newer"))
	got, _ := client.CertificatesV1().ClusterTrustBundles().Get(context.Background(), existing.Name, metav1.GetOptions{})
	if want := versioned("L", "6"); !equalMaps(got.Annotations, want) {
		t.Errorf("annotations %v, want %v", got.Annotations, want)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
