package trust_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
func stepsDown(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, trust.ErrStale) || !strings.Contains(fmt.Sprint(err), why) {
			t.Fatalf("Run: %v, want it to step down with ErrStale, saying %q", err, why)
		}
	case <-time.After(trust.StaleGrace + 5*time.Second):
		t.Fatal("a publisher behind the published bundle did not step down")
	}
}

// The Lease the tests' Marks record on.
const (
	leaseNS   = "meshca"
	leaseName = "meshca-trust-publisher"
)

// leaseWith is the publishers' Lease carrying annotations.
func leaseWith(annotations map[string]string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: leaseNS, Name: leaseName, Annotations: annotations}}
}

func markOf(client kubernetes.Interface) *trust.Mark {
	return &trust.Mark{Client: client, Namespace: leaseNS, Name: leaseName}
}

func leaseAnnotations(t *testing.T, client kubernetes.Interface) map[string]string {
	t.Helper()
	l, err := client.CoordinationV1().Leases(leaseNS).Get(context.Background(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Annotations
}

// TestPublisherBundleVersions: the Lease's record decides. A replica
// whose CA state is older than the one recorded (the same lineage, a
// lower sequence), or of another lineage (a state bootstrapped anew),
// does not write, counts it stale, says so once and steps down (its Run
// returns ErrStale); once it has caught up (or an operator removed the
// record), its next term writes and records its version. A bundle with no
// version (pinned anchors) is written whatever is recorded. What the
// ConfigMaps carry is never read back: anyone who may edit a ConfigMap
// may write it.
func TestPublisherBundleVersions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		recorded  map[string]string // the Lease's annotations
		onCM      map[string]string // the ConfigMap's
		cmData    string            // the ConfigMap's bundle; "published" when empty
		ours      trust.BundleVersion
		written   bool
		said      string
		recovered map[string]string // the Lease's annotations that let a refused replica write
		after     map[string]string // the Lease's annotations at the end
	}{
		{name: "older of the same lineage", recorded: versioned("L", "5"), ours: trust.BundleVersion{Lineage: "L", Sequence: 3},
			said: "newer than this replica's CA state", recovered: versioned("L", "5"), after: versioned("L", "7")},
		{name: "equal of the same lineage", recorded: versioned("L", "5"), ours: trust.BundleVersion{Lineage: "L", Sequence: 5}, written: true,
			after: versioned("L", "5")},
		{name: "newer of the same lineage", recorded: versioned("L", "5"), ours: trust.BundleVersion{Lineage: "L", Sequence: 6}, written: true,
			after: versioned("L", "6")},
		{name: "another lineage", recorded: versioned("M", "9"), ours: trust.BundleVersion{Lineage: "L", Sequence: 1},
			said: "belongs to another CA state", recovered: map[string]string{"team": "kept"}, after: versioned("L", "7")},
		{name: "nothing recorded", recorded: map[string]string{"team": "kept"}, ours: trust.BundleVersion{Lineage: "L", Sequence: 1}, written: true,
			after: versioned("L", "1")},
		{name: "the sequence removed by an operator", recorded: map[string]string{trust.AnnotationLineage: "L", "team": "kept"},
			ours: trust.BundleVersion{Lineage: "L", Sequence: 1}, written: true, after: versioned("L", "1")},
		{name: "unreadable sequence", recorded: versioned("L", "x"), ours: trust.BundleVersion{Lineage: "L", Sequence: 1}, written: true,
			after: versioned("L", "1")},
		{name: "ours without a version", recorded: versioned("L", "5"), ours: trust.BundleVersion{}, written: true, after: versioned("L", "5")},
		{name: "another lineage, its sequence removed", recorded: map[string]string{trust.AnnotationLineage: "M"}, ours: trust.BundleVersion{Lineage: "L", Sequence: 1},
			said: "belongs to another CA state", recovered: map[string]string{"team": "kept"}, after: versioned("L", "7")},
		{name: "nothing to write, nothing recorded (an upgrade)", recorded: map[string]string{"team": "kept"}, onCM: versioned("L", "5"), cmData: "ours",
			ours: trust.BundleVersion{Lineage: "L", Sequence: 5}, written: true, after: versioned("L", "5")},
		{name: "a ConfigMap's annotations forged", recorded: versioned("L", "5"), onCM: versioned("L", "18446744073709551615"),
			ours: trust.BundleVersion{Lineage: "L", Sequence: 6}, written: true, after: versioned("L", "6")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			existing := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a", Annotations: tc.onCM,
					Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
				Data: map[string]string{trust.DataKey: cmp.Or(tc.cmData, "published")},
			}
			client := fake.NewClientset(namespace("a", nil, false), existing, leaseWith(tc.recorded))
			obs, l := &counter{}, &logs{}
			b := &bundle{}
			b.setVersioned("ours", tc.ours)
			newTerm := func() func(context.Context) error {
				p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get, Observer: obs, Logger: l.logger(), Mark: markOf(client)})
				if err != nil {
					t.Fatal(err)
				}
				return p.Run
			}
			term := runTerm(t, newTerm())
			if tc.written {
				eventually(t, "our bundle written", published(client, "a", "ours"))
			} else {
				stepsDown(t, term, tc.said)
				if got := configMap(client, "a").Data[trust.DataKey]; got != "published" {
					t.Fatalf("the bundle was written over the recorded one: %q", got)
				}
				if obs.get(trust.ResultStale) == 0 || l.count(tc.said) != 1 || l.count(leaseNS+"/"+leaseName) != 1 {
					t.Errorf("stale writes %d, log:\n%s; want counted and said once (%q), naming the Lease", obs.get(trust.ResultStale), l.buf.String(), tc.said)
				}
				// Caught up, or the record removed: the next term writes.
				lease, _ := client.CoordinationV1().Leases(leaseNS).Get(context.Background(), leaseName, metav1.GetOptions{})
				lease.Annotations = tc.recovered
				if _, err := client.CoordinationV1().Leases(leaseNS).Update(context.Background(), lease, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				b.setVersioned("caught up", trust.BundleVersion{Lineage: "L", Sequence: 7})
				runTerm(t, newTerm())
				eventually(t, "written once caught up", published(client, "a", "caught up"))
			}
			eventually(t, "the Lease's record", func() bool { return equalMaps(leaseAnnotations(t, client), tc.after) })
			if v := b.get().Version; !v.IsZero() && configMap(client, "a").Annotations[trust.AnnotationSequence] != tc.after[trust.AnnotationSequence] {
				t.Errorf("the ConfigMap's annotations %v, want the version written", configMap(client, "a").Annotations)
			}
		})
	}
}

// TestForgedConfigMapVersionIsIgnored: a tenant who annotates the
// ConfigMap of its namespace with a huge sequence of the CA's lineage
// stops nothing: a current replica updates every namespace, that one's
// included. (The publishers once trusted what the ConfigMaps said, and
// such a ConfigMap froze the bundle of every namespace.)
func TestForgedConfigMapVersionIsIgnored(t *testing.T) {
	cm := func(ns, pem string, annotations map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: ns, Annotations: annotations,
			Labels: map[string]string{trust.LabelKey: trust.LabelValue}}, Data: map[string]string{trust.DataKey: pem}}
	}
	client := fake.NewClientset(namespace("tenant", nil, false), namespace("victim", nil, false), leaseWith(versioned("L", "5")),
		cm("tenant", "old roots", versioned("L", "18446744073709551615")), cm("victim", "old roots", versioned("L", "5")))
	b := &bundle{}
	b.setVersioned("new roots", trust.BundleVersion{Lineage: "L", Sequence: 6})
	p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get, Mark: markOf(client)})
	if err != nil {
		t.Fatal(err)
	}
	term := runTerm(t, p.Run)
	eventually(t, "victim updated", published(client, "victim", "new roots"))
	eventually(t, "tenant repaired", published(client, "tenant", "new roots"))
	select {
	case err := <-term:
		t.Fatalf("the current replica stepped down: %v", err)
	case <-time.After(trust.StaleGrace + time.Second):
	}
}

// TestPublisherCreatesNothingWhenBehind: a replica behind the recorded
// version creates its older bundle in no namespace: it steps down, and
// its next term, caught up, writes both.
func TestPublisherCreatesNothingWhenBehind(t *testing.T) {
	existing := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: trust.ConfigMapName, Namespace: "a", Annotations: versioned("L", "5"),
			Labels: map[string]string{trust.LabelKey: trust.LabelValue}},
		Data: map[string]string{trust.DataKey: "published"},
	}
	client := fake.NewClientset(namespace("a", nil, false), namespace("b", nil, false), existing, leaseWith(versioned("L", "5")))
	b := &bundle{}
	b.setVersioned("older", trust.BundleVersion{Lineage: "L", Sequence: 4})
	newTerm := func() func(context.Context) error {
		p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get, Mark: markOf(client)})
		if err != nil {
			t.Fatal(err)
		}
		return p.Run
	}
	stepsDown(t, runTerm(t, newTerm()), "newer than this replica's CA state")
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
	client := fake.NewClientset(namespace("a", nil, false), existing, leaseWith(versioned("L", "5")))
	obs := &counter{}
	b := &bundle{}
	b.setVersioned("behind", trust.BundleVersion{Lineage: "L", Sequence: 4})
	p, err := trust.NewPublisher(trust.Config{Client: client, Bundle: b.get, Observer: obs, Mark: markOf(client)})
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
// keeps the same rule, on the same record.
func TestClusterTrustBundleBundleVersions(t *testing.T) {
	existing := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-cluster.local", Labels: map[string]string{trust.LabelManagedBy: trust.ManagedBy},
			Annotations: versioned("L", "5")},
		Spec: certv1.ClusterTrustBundleSpec{TrustBundle: "published"},
	}
	client := fake.NewClientset(existing, leaseWith(versioned("L", "5")))
	obs := &counter{}
	b := &bundle{}
	b.setVersioned("older", trust.BundleVersion{Lineage: "L", Sequence: 4})
	newTerm := func() func(context.Context) error {
		p, err := trust.NewClusterTrustBundlePublisher(trust.ClusterTrustBundleConfig{Client: client, TrustDomain: testTD,
			Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}}, Bundle: b.get, Observer: obs, Mark: markOf(client)})
		if err != nil {
			t.Fatal(err)
		}
		return p.Run
	}
	stepsDown(t, runTerm(t, newTerm()), "newer than this replica's CA state")
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
	if want := versioned("L", "6"); !equalMaps(leaseAnnotations(t, client), want) {
		t.Errorf("the Lease's annotations %v, want %v", leaseAnnotations(t, client), want)
	}
}

// TestClusterTrustBundleNotCreatedWhenBehind: with no ClusterTrustBundle
// yet, a replica whose state is older than the Lease's record creates
// none, and steps down.
func TestClusterTrustBundleNotCreatedWhenBehind(t *testing.T) {
	client := fake.NewClientset(leaseWith(versioned("L", "5")))
	obs := &counter{}
	b := &bundle{}
	b.setVersioned("older", trust.BundleVersion{Lineage: "L", Sequence: 4})
	p, err := trust.NewClusterTrustBundlePublisher(trust.ClusterTrustBundleConfig{Client: client, TrustDomain: testTD,
		Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}}, Bundle: b.get, Observer: obs, Mark: markOf(client)})
	if err != nil {
		t.Fatal(err)
	}
	stepsDown(t, runTerm(t, p.Run), "newer than this replica's CA state")
	list, err := client.CertificatesV1().ClusterTrustBundles().List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 || obs.get(trust.ResultStale) == 0 {
		t.Fatalf("a replica behind created %d ClusterTrustBundles (%v), or did not count stale", len(list.Items), err)
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
