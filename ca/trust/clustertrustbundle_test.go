package trust_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/trust"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var testTD = spiffeid.RequireTrustDomainFromString("cluster.local")

func TestClusterTrustBundleName(t *testing.T) {
	for _, tc := range []struct {
		signer, td, want, err string
	}{
		{td: "cluster.local", want: "meshca-cluster.local"},
		{signer: "meshca.io/svid", td: "cluster.local", want: "meshca.io:svid:cluster.local"},
		{signer: "example.com/mesh.svid", td: "prod_east.example", want: "example.com:mesh.svid:prod-east.example"},
		{signer: "meshca.io", td: "cluster.local", err: `trust: signer name "meshca.io": want exactly one '/', as in example.com/signer`},
		{signer: "meshca.io/svid/x", td: "cluster.local", err: `want exactly one '/'`},
		{signer: "localhost/svid", td: "cluster.local", err: "the domain needs at least two labels, as in example.com"},
		{signer: "kubernetes.io/kubelet-serving", td: "cluster.local", err: "the kubernetes.io and k8s.io domains are reserved"},
		{signer: "x.k8s.io/svid", td: "cluster.local", err: "reserved"},
		{signer: "meshca_io.example/svid", td: "cluster.local", err: `domain label "meshca_io"`},
		{signer: "meshca.io/SVID", td: "cluster.local", err: `path "SVID"`},
		{signer: "meshca.io/svid", td: "a..b", err: `trust: ClusterTrustBundle: name suffix "a..b" from trust domain "a..b"`},
		{td: "a..b", err: `trust: ClusterTrustBundle: name "meshca-a..b" from trust domain "a..b"`},
		{td: strings.Repeat("x", 64), err: "is not a valid label value"},
	} {
		t.Run(tc.signer+" "+tc.td, func(t *testing.T) {
			got, err := trust.ClusterTrustBundleName(tc.signer, spiffeid.RequireTrustDomainFromString(tc.td))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// discovery serves clustertrustbundles at the given group versions.
type discovery struct {
	served []string
	fail   atomic.Int32 // calls left that fail with a 503
}

func (d *discovery) ServerResourcesForGroupVersionWithContext(_ context.Context, gv string) (*metav1.APIResourceList, error) {
	if d.fail.Add(-1) >= 0 {
		return nil, apierrors.NewServiceUnavailable("discovery is warming up")
	}
	for _, s := range d.served {
		if s == gv {
			return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "clustertrustbundles"}}}, nil
		}
	}
	if gv == "certificates.k8s.io/v1" { // the group version is served, without the resource
		return &metav1.APIResourceList{GroupVersion: gv, APIResources: []metav1.APIResource{{Name: "certificatesigningrequests"}}}, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{}, gv)
}

// logs is a JSON slog destination tests read while the publisher writes.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logs) count(fragment string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), fragment)
}

func (l *logs) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// startCTB runs a ClusterTrustBundlePublisher until the test ends and
// fails the test if Run returns before that.
func startCTB(t *testing.T, c trust.ClusterTrustBundleConfig) *trust.ClusterTrustBundlePublisher {
	t.Helper()
	if c.TrustDomain.IsZero() {
		c.TrustDomain = testTD
	}
	p, err := trust.NewClusterTrustBundlePublisher(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		select {
		case err := <-done:
			t.Errorf("Run returned before its context ended: %v", err)
			return
		default:
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return p
}

func ctb(client kubernetes.Interface, name string) *certv1.ClusterTrustBundle {
	b, err := client.CertificatesV1().ClusterTrustBundles().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return b
}

func holds(client kubernetes.Interface, name, pem string) func() bool {
	return func() bool {
		b := ctb(client, name)
		return b != nil && b.Spec.TrustBundle == pem &&
			b.Labels[trust.LabelManagedBy] == trust.ManagedBy && b.Labels[trust.LabelTrustDomain] == "cluster.local"
	}
}

func TestClusterTrustBundleLifecycle(t *testing.T) {
	client := fake.NewClientset()
	var b bundle
	b.set("root-1")
	obs := &counter{}
	p := startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}},
		Bundle: b.get, SignerName: "meshca.io/svid", Observer: obs})
	const name = "meshca.io:svid:cluster.local"
	if p.Name() != name {
		t.Fatalf("Name = %q, want %q", p.Name(), name)
	}
	ctx := context.Background()
	eventually(t, "created", holds(client, name, "root-1"))
	if got := ctb(client, name).Spec.SignerName; got != "meshca.io/svid" {
		t.Errorf("signerName = %q", got)
	}

	b.set("root-1\nroot-2")
	p.BundleChanged()
	eventually(t, "updated", holds(client, name, "root-1\nroot-2"))

	cur := ctb(client, name)
	cur.Spec.TrustBundle = "tampered"
	cur.Labels["team"] = "kept"
	cur.Labels[trust.LabelTrustDomain] = "other.domain"
	if _, err := client.CertificatesV1().ClusterTrustBundles().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "edit repaired", holds(client, name, "root-1\nroot-2"))
	if got := ctb(client, name).Labels["team"]; got != "kept" {
		t.Errorf("another label was dropped: team=%q", got)
	}

	if err := client.CertificatesV1().ClusterTrustBundles().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "recreated", holds(client, name, "root-1\nroot-2"))

	// The end state, not the timing: the object holds the bundle, and
	// the publisher has settled. Two creates and at least two updates
	// (the new bundle, the repair) were needed; a write decided on a
	// cache that had not yet seen the publisher's own update adds one
	// (the fake clientset takes a stale resourceVersion, which the
	// apiserver would refuse as a conflict), and how many such reads
	// happen depends on the machine's load. What must not happen is a
	// publisher that keeps writing once the object is right.
	if got := obs.get(trust.ResultCreated); got != 2 {
		t.Errorf("created %d times, want 2", got)
	}
	if got := obs.get(trust.ResultUpdated); got < 2 {
		t.Errorf("updated %d times, want at least 2 (the new bundle, the repair)", got)
	}
	settled := map[string]int{trust.ResultCreated: obs.get(trust.ResultCreated), trust.ResultUpdated: obs.get(trust.ResultUpdated)}
	rv := ctb(client, name).ResourceVersion
	time.Sleep(time.Second)
	for r, n := range settled {
		if got := obs.get(r); got != n {
			t.Errorf("%s %d more times after the object was right: the publisher did not settle", r, got-n)
		}
	}
	if !holds(client, name, "root-1\nroot-2")() || ctb(client, name).ResourceVersion != rv {
		t.Errorf("the ClusterTrustBundle changed after the publisher settled")
	}
}

func TestClusterTrustBundleUnlinked(t *testing.T) {
	client := fake.NewClientset()
	startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}},
		Bundle: pemOnly("root")})
	eventually(t, "created", holds(client, "meshca-cluster.local", "root"))
	if got := ctb(client, "meshca-cluster.local").Spec.SignerName; got != "" {
		t.Errorf("signerName = %q, want none", got)
	}
}

func TestClusterTrustBundleLeavesForeignObject(t *testing.T) {
	foreign := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-cluster.local", Labels: map[string]string{trust.LabelManagedBy: "helm"}},
		Spec:       certv1.ClusterTrustBundleSpec{TrustBundle: "theirs"},
	}
	other := &certv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "someone-else"}, Spec: certv1.ClusterTrustBundleSpec{TrustBundle: "x"}}
	client := fake.NewClientset(foreign, other)
	var writes atomic.Int32
	client.PrependReactor("*", "clustertrustbundles", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
			writes.Add(1)
		}
		return false, nil, nil
	})
	var l logs
	obs := &counter{}
	p := startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}},
		Bundle: pemOnly("ours"), Observer: obs, Logger: l.logger()})
	eventually(t, "not_owned observed", func() bool { return obs.get(trust.ResultNotOwned) == 1 })
	p.BundleChanged()
	eventually(t, "not_owned observed again", func() bool { return obs.get(trust.ResultNotOwned) == 2 })
	if n := writes.Load(); n != 0 {
		t.Errorf("%d writes to ClusterTrustBundles meshca does not own", n)
	}
	if got := ctb(client, "meshca-cluster.local").Spec.TrustBundle; got != "theirs" {
		t.Errorf("foreign bundle = %q", got)
	}
	if n := l.count(`"msg":"a ClusterTrustBundle of that name exists and is not managed by meshca; leaving it alone"`); n != 1 {
		t.Errorf("%d warnings about the foreign object, want 1 (once per version of it)", n)
	}
}

func TestClusterTrustBundleOlderVersions(t *testing.T) {
	get := map[string]func(kubernetes.Interface) (string, error){
		"certificates.k8s.io/v1beta1": func(c kubernetes.Interface) (string, error) {
			b, err := c.CertificatesV1beta1().ClusterTrustBundles().Get(context.Background(), "meshca-cluster.local", metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return b.Spec.TrustBundle, nil
		},
		"certificates.k8s.io/v1alpha1": func(c kubernetes.Interface) (string, error) {
			b, err := c.CertificatesV1alpha1().ClusterTrustBundles().Get(context.Background(), "meshca-cluster.local", metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return b.Spec.TrustBundle, nil
		},
	}
	for gv, read := range get {
		t.Run(gv, func(t *testing.T) {
			client := fake.NewClientset()
			var l logs
			var b bundle
			b.set("root-1")
			p := startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{gv, "certificates.k8s.io/v1alpha1"}},
				Bundle: b.get, Logger: l.logger()})
			eventually(t, "created through "+gv, func() bool { got, _ := read(client); return got == "root-1" })
			b.set("root-2")
			p.BundleChanged()
			eventually(t, "updated through "+gv, func() bool { got, _ := read(client); return got == "root-2" })
			if n := l.count(`"version":"` + gv + `"`); n != 1 {
				t.Errorf("the version chosen is not logged once:\n%s", l.buf.String())
			}
			if ctb(client, "meshca-cluster.local") != nil {
				t.Error("written through v1, which is not served")
			}
		})
	}
}

func TestClusterTrustBundleAPIAbsent(t *testing.T) {
	client := fake.NewClientset()
	var l logs
	d := &discovery{}
	d.fail.Store(1) // the first answer is an error, retried
	startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: d, Bundle: pemOnly("root"), Logger: l.logger()})
	const skip = `"msg":"the apiserver serves no ClusterTrustBundle API (certificates.k8s.io/v1, certificates.k8s.io/v1beta1, certificates.k8s.io/v1alpha1); not publishing the trust bundle as a ClusterTrustBundle"`
	eventually(t, "the skip logged", func() bool { return l.count(skip) == 1 })
	time.Sleep(200 * time.Millisecond) // Run keeps running: startCTB's cleanup checks
	if n := l.count(`"msg":"cannot tell whether the apiserver serves ClusterTrustBundles; retrying"`); n != 1 {
		t.Errorf("%d retry warnings, want 1", n)
	}
	if n := len(client.Actions()); n != 0 {
		t.Errorf("%d calls to the apiserver without the API: %v", n, client.Actions())
	}
}

func TestClusterTrustBundleRefusedWrites(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}
	for _, tc := range []struct {
		name   string
		err    error
		result string
		log    string
	}{
		{"forbidden", apierrors.NewForbidden(gr, "meshca.io:svid:cluster.local", errors.New(`user not permitted to attest for signerName "meshca.io/svid"`)),
			trust.ResultForbidden, `"msg":"not allowed to create the trust bundle ClusterTrustBundle; it needs list, watch, create and update on clustertrustbundles, and attest on the certificates.k8s.io signer meshca.io/svid"`},
		{"invalid", apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "ClusterTrustBundle"}, "meshca.io:svid:cluster.local",
			field.ErrorList{field.Invalid(field.NewPath("spec", "trustBundle"), "<value omitted>", "entry 0 is not a CA certificate")}),
			trust.ResultInvalid, `"msg":"the apiserver refused the trust bundle ClusterTrustBundle"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var creates atomic.Int32
			client.PrependReactor("create", "clustertrustbundles", func(k8stesting.Action) (bool, runtime.Object, error) {
				creates.Add(1)
				return true, nil, tc.err
			})
			var l logs
			obs := &counter{}
			startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}},
				Bundle: pemOnly("root"), SignerName: "meshca.io/svid", Observer: obs, Logger: l.logger()})
			eventually(t, tc.result+" observed", func() bool { return obs.get(tc.result) == 1 })
			time.Sleep(300 * time.Millisecond)
			if n := creates.Load(); n != 1 {
				t.Errorf("%d creates; a refusal must wait for the resync or a bundle change", n)
			}
			if n := l.count(tc.log); n != 1 {
				t.Errorf("log lines %q: %d, want 1\n%s", tc.log, n, l.buf.String())
			}
		})
	}
}

func TestClusterTrustBundleRetriesConflicts(t *testing.T) {
	existing := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-cluster.local", Labels: map[string]string{trust.LabelManagedBy: trust.ManagedBy}},
		Spec:       certv1.ClusterTrustBundleSpec{TrustBundle: "old"},
	}
	client := fake.NewClientset(existing)
	var conflicts atomic.Int32
	client.PrependReactor("update", "clustertrustbundles", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts.Add(1) <= 2 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "clustertrustbundles"}, existing.Name, errors.New("stale"))
		}
		return false, nil, nil
	})
	obs := &counter{}
	startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}},
		Bundle: pemOnly("new"), Observer: obs})
	eventually(t, "updated after conflicts", holds(client, existing.Name, "new"))
	if got := obs.get(trust.ResultConflict); got != 2 {
		t.Errorf("conflicts observed %d, want 2", got)
	}
}

func TestClusterTrustBundleQuiet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bundle string
		objs   []runtime.Object
	}{
		{name: "empty bundle"},
		{name: "up to date", bundle: "root", objs: []runtime.Object{&certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: "meshca-cluster.local",
				Labels: map[string]string{trust.LabelManagedBy: trust.ManagedBy, trust.LabelTrustDomain: "cluster.local"}},
			Spec: certv1.ClusterTrustBundleSpec{TrustBundle: "root"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objs...)
			var writes atomic.Int32
			client.PrependReactor("*", "clustertrustbundles", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if v := a.GetVerb(); v == "create" || v == "update" {
					writes.Add(1)
				}
				return false, nil, nil
			})
			p := startCTB(t, trust.ClusterTrustBundleConfig{Client: client, Discovery: &discovery{served: []string{"certificates.k8s.io/v1"}},
				Bundle: pemOnly(tc.bundle)})
			p.BundleChanged()
			time.Sleep(300 * time.Millisecond)
			if n := writes.Load(); n != 0 {
				t.Errorf("%d writes", n)
			}
		})
	}
}

func TestNewClusterTrustBundlePublisherRefuses(t *testing.T) {
	client := fake.NewClientset()
	root := pemOnly("root")
	for _, tc := range []struct {
		name string
		c    trust.ClusterTrustBundleConfig
		want string
	}{
		{"no client", trust.ClusterTrustBundleConfig{Bundle: root, TrustDomain: testTD}, "trust: config: Client is required"},
		{"no bundle", trust.ClusterTrustBundleConfig{Client: client, TrustDomain: testTD}, "trust: config: Bundle is required"},
		{"no trust domain", trust.ClusterTrustBundleConfig{Client: client, Bundle: root}, "trust: ClusterTrustBundle: no trust domain"},
		{"negative resync", trust.ClusterTrustBundleConfig{Client: client, Bundle: root, TrustDomain: testTD, Resync: -time.Second}, "Resync -1s is negative"},
		{"bad signer", trust.ClusterTrustBundleConfig{Client: client, Bundle: root, TrustDomain: testTD, SignerName: "svid"}, `signer name "svid"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := trust.NewClusterTrustBundlePublisher(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestClusterTrustBundleRunTwice(t *testing.T) {
	p := startCTB(t, trust.ClusterTrustBundleConfig{Client: fake.NewClientset(), Discovery: &discovery{},
		Bundle: pemOnly("")})
	time.Sleep(50 * time.Millisecond)
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "already started") {
		t.Errorf("second Run = %v, want an error", err)
	}
}
