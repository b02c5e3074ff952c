package serve_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/ca/leader"
	"github.com/meshca/meshca/ca/serve"
	"github.com/meshca/meshca/ca/trust"
)

// syncBuffer is a log destination the test reads while the server writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAssembleClusterTrustBundleWithoutTheAPI: publishing a
// ClusterTrustBundle to an apiserver that does not serve the API (the fake
// one serves no group) is skipped with one log line; the server serves on,
// the ConfigMap publishers beside it run (the CRLs' writes nothing: the
// state has no CRL), and Run ends cleanly.
func TestAssembleClusterTrustBundleWithoutTheAPI(t *testing.T) {
	c := config(t)
	var logs syncBuffer
	c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	c.Trust = serve.Trust{Publish: true, CRL: true, ClusterTrustBundle: true, ClusterTrustBundleSigner: "meshca.io/svid", LeaseNamespace: "istio-system"}
	p := start(t, c)
	const skip = `"msg":"the apiserver serves no ClusterTrustBundle API (certificates.k8s.io/v1, certificates.k8s.io/v1beta1, certificates.k8s.io/v1alpha1); not publishing the trust bundle as a ClusterTrustBundle","name":"meshca.io:svid:cluster.local","signer_name":"meshca.io/svid"`
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), skip); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no skip line within 10s:\n%s", logs.String())
		}
	}
	if _, err := client(t, p, c, token, nil).Fetch(context.Background(), web, caclient.Options{}); err != nil {
		t.Fatalf("SVID after the skip: %v", err)
	}
	r, err := http.Get("http://" + p.Addresses().Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, m := range []string{
		`meshca_trust_writes_total{document="bundle",kind="clustertrustbundle",result="created"} 0`,
		`meshca_trust_writes_total{document="bundle",kind="configmap",result="created"}`,
		`meshca_trust_writes_total{document="crl",kind="configmap",result="created"} 0`,
		`meshca_leader{lease="meshca-trust-publisher"}`,
	} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if strings.Contains(string(body), "meshca_trust_crl_next_update_timestamp_seconds ") {
		t.Error("a CRL expiry reported while no CRL is published")
	}
	if n := strings.Count(logs.String(), "not publishing the trust bundle as a ClusterTrustBundle"); n != 1 {
		t.Errorf("%d skip lines, want 1", n)
	}
}

// TestAssembleTrustRefusals: a publishing setting the assembly cannot use
// names the flag at fault.
func TestAssembleTrustRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		td    string
		trust serve.Trust
		field string
	}{
		{name: "no lease namespace", trust: serve.Trust{ClusterTrustBundle: true}, field: "trust-lease-namespace"},
		{name: "bad signer name", trust: serve.Trust{ClusterTrustBundle: true, ClusterTrustBundleSigner: "svid", LeaseNamespace: "ns"},
			field: "cluster-trust-bundle-signer-name"},
		{name: "trust domain unfit for a name", td: "a..b", trust: serve.Trust{ClusterTrustBundle: true, LeaseNamespace: "ns"},
			field: "trust-domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config(t)
			if tc.td != "" {
				c.TrustDomain = spiffeid.RequireTrustDomainFromString(tc.td)
			}
			c.Trust = tc.trust
			_, err := serve.Assemble(context.Background(), c)
			var fe *serve.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want a FieldError for %q", err, tc.field)
			}
		})
	}
}

// TestAssembleTrustLeaseLost: a replica whose trust Lease cannot be
// renewed for RenewDeadline (the apiserver refuses every Lease call)
// stops publishing but serves on; once the apiserver answers again it
// leads again with new publishers, which write what changed meanwhile.
// Both publishers run, so neither may refuse a second term.
func TestAssembleTrustLeaseLost(t *testing.T) {
	c := config(t)
	c.Trust = serve.Trust{Publish: true, ClusterTrustBundle: true, LeaseNamespace: "istio-system"}
	var apiserver *fake.Clientset
	var leasesDown atomic.Bool
	c.Clusters.NewClient = func(cfg *rest.Config) (kubernetes.Interface, error) {
		cl, err := fakeCluster(cfg)
		if err != nil {
			return nil, err
		}
		apiserver = cl.(*fake.Clientset)
		apiserver.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if leasesDown.Load() {
				return true, nil, errors.New("apiserver unreachable")
			}
			return false, nil, nil
		})
		return apiserver, nil
	}
	p := start(t, c)
	published := func(ns string) bool {
		_, err := apiserver.CoreV1().ConfigMaps(ns).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
		return err == nil
	}
	leads := func(want int) func() bool {
		return func() bool {
			return strings.Contains(metrics(t, p), fmt.Sprintf(`meshca_leader{lease="%s"} %d`, serve.TrustLease, want))
		}
	}
	addNamespace(t, apiserver, "shop")
	eventually(t, 10*time.Second, "leading and publishing to shop", func() bool { return leads(1)() && published("shop") })

	leasesDown.Store(true)
	eventually(t, leader.RenewDeadline+10*time.Second, "the Lease lost", leads(0))
	addNamespace(t, apiserver, "late")
	if _, err := client(t, p, c, token, nil).Fetch(context.Background(), web, caclient.Options{}); err != nil {
		t.Fatalf("SVID after the Lease was lost: %v", err)
	}
	time.Sleep(time.Second)
	if published("late") {
		t.Fatal("published to a namespace created after the Lease was lost")
	}

	leasesDown.Store(false)
	eventually(t, 3*leader.RetryPeriod, "leading again and publishing to late", func() bool { return leads(1)() && published("late") })
}

func addNamespace(t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds, failing the test after within.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %v", what, within)
		}
	}
}
