package kube_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/kube"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

const rsNamespace = "istio-system"

// rsFixture runs RemoteSecrets over a fake apiserver.
type rsFixture struct {
	t      *testing.T
	client *fake.Clientset
	reg    *clusters
	prom   *prometheus.Registry
	logs   rsLogs
}

// clusters is an in-memory kube.Clusters: the ids held by the local
// cluster and --remote-cluster flags, and the server of the kubeconfig
// each cluster from a Secret was built from.
type clusters struct {
	mu    sync.Mutex
	fixed map[string]bool
	hosts map[string]string
}

func (c *clusters) Has(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.hosts[id]
	return ok || c.fixed[id]
}

func (c *clusters) Put(_ context.Context, id string, cfg *rest.Config, replace bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.hosts[id]; c.fixed[id] || (ok && !replace) {
		return fmt.Errorf("cluster %s: %w", id, kube.ErrClusterExists)
	}
	c.hosts[id] = cfg.Host
	return nil
}

func (c *clusters) Remove(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.hosts, id)
}

// ids lists every cluster id held, sorted.
func (c *clusters) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id := range c.fixed {
		out = append(out, id)
	}
	for id := range c.hosts {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

type rsLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *rsLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *rsLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newRSFixture starts the watcher with the local cluster "Kubernetes" and
// the --remote-cluster ids given.
func newRSFixture(t *testing.T, allow kube.KubeconfigAllow, flagRemotes ...string) *rsFixture {
	f := &rsFixture{t: t, client: fake.NewClientset(), prom: prometheus.NewRegistry(),
		reg: &clusters{fixed: map[string]bool{"Kubernetes": true}, hosts: map[string]string{}}}
	for _, id := range flagRemotes {
		f.reg.fixed[id] = true
	}
	rs := kube.NewRemoteSecrets(kube.RemoteSecretsConfig{
		Client: f.client, Namespace: rsNamespace, Clusters: f.reg, Allow: allow,
		Metrics: kube.NewRemoteSecretsMetrics(f.prom),
		Logger:  slog.New(slog.NewTextHandler(&f.logs, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rs.Run(ctx); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return f
}

// host returns the server of cluster id, or "" when there is no such
// cluster or it was not built from a Secret.
func (f *rsFixture) host(id string) string {
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	return f.reg.hosts[id]
}

func (f *rsFixture) refused(reason string) float64 {
	f.t.Helper()
	mfs, err := f.prom.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "meshca_remote_cluster_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	f.t.Fatalf("no meshca_remote_cluster_refused_total{reason=%q}", reason)
	return 0
}

// put creates or updates a labelled Secret.
func (f *rsFixture) put(name string, data map[string][]byte) {
	f.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: rsNamespace, Labels: map[string]string{kube.RemoteSecretLabel: "true"}}, Data: data}
	secrets := f.client.CoreV1().Secrets(rsNamespace)
	if _, err := secrets.Update(context.Background(), s, metav1.UpdateOptions{}); err == nil {
		return
	}
	if _, err := secrets.Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *rsFixture) delete(name string) {
	f.t.Helper()
	if err := f.client.CoreV1().Secrets(rsNamespace).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// wait polls cond until it holds.
func (f *rsFixture) wait(what string, cond func() bool) {
	f.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s; log:\n%s", what, f.logs.String())
		}
	}
}

func rsKubeconfig(server string) []byte {
	return testKubeconfig(server, "", "    token: "+kcSecretToken)
}

func TestRemoteSecretsRefuseUnsafeKubeconfigs(t *testing.T) {
	for _, tc := range kcFeatureCases(t) {
		t.Run(string(tc.feature), func(t *testing.T) {
			raw := tc.raw()

			f := newRSFixture(t, nil)
			f.put("remote-east", map[string][]byte{"east": raw, "west": rsKubeconfig("https://west.example")})
			f.wait("the safe cluster", func() bool { return f.host("west") == "https://west.example" })
			f.wait("the refusal", func() bool { return f.refused(tc.reason) == 1 })
			if f.host("east") != "" {
				t.Error("the unsafe cluster was added")
			}
			logs := f.logs.String()
			for _, want := range []string{"remote cluster refused", "secret=" + rsNamespace + "/remote-east", "cluster=east", "reason=" + tc.reason, string(tc.feature)} {
				if !strings.Contains(logs, want) {
					t.Errorf("log lacks %q:\n%s", want, logs)
				}
			}
			if strings.Contains(logs, kcSecretToken) {
				t.Errorf("the token leaked into the log:\n%s", logs)
			}

			allowed := newRSFixture(t, kube.KubeconfigAllow{tc.feature: true})
			allowed.put("remote-east", map[string][]byte{"east": raw})
			allowed.wait("the allowed cluster", func() bool { return allowed.host("east") == tc.serverURL() })
			if n := allowed.refused(tc.reason); n != 0 {
				t.Errorf("allowed, yet %v refusals", n)
			}
		})
	}
}

func TestRemoteSecretsDuplicateClusterIDs(t *testing.T) {
	f := newRSFixture(t, nil, "west")
	dups := func(n float64) func() bool { return func() bool { return f.refused("duplicate_cluster_id") == n } }

	// The local id and a --remote-cluster id cannot be shadowed.
	f.put("a", map[string][]byte{"east": rsKubeconfig("https://a1.example"), "west": rsKubeconfig("https://evil.example"), "Kubernetes": rsKubeconfig("https://evil.example")})
	f.wait("east from a", func() bool { return f.host("east") == "https://a1.example" })
	f.wait("two refusals", dups(2))
	if f.host("west") != "" || f.host("Kubernetes") != "" {
		t.Error("a Secret replaced the local cluster or a --remote-cluster")
	}

	// A second Secret with the same id waits.
	f.put("b", map[string][]byte{"east": rsKubeconfig("https://b.example")})
	f.wait("b refused", dups(3))
	if h := f.host("east"); h != "https://a1.example" {
		t.Errorf("east is %q after a duplicate, want a's", h)
	}
	logs := f.logs.String()
	for _, want := range []string{"owned by Secret " + rsNamespace + "/a", "the local cluster's or a --remote-cluster's"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}

	// The owner may replace its own cluster.
	f.put("a", map[string][]byte{"east": rsKubeconfig("https://a2.example")})
	f.wait("east replaced by a", func() bool { return f.host("east") == "https://a2.example" })

	// When the owner goes, the waiting Secret takes the id over.
	f.delete("a")
	f.wait("east from b", func() bool { return f.host("east") == "https://b.example" })
	f.delete("b")
	f.wait("east removed", func() bool { return !f.reg.Has("east") })
	if n := f.refused("duplicate_cluster_id"); n != 3 {
		t.Errorf("%v duplicate refusals, want 3", n)
	}
	if got := fmt.Sprint(f.reg.ids()); got != "[Kubernetes west]" {
		t.Errorf("clusters %s", got)
	}
}

func TestRemoteSecretsRefusedUpdateRemovesCluster(t *testing.T) {
	f := newRSFixture(t, nil)
	f.put("a", map[string][]byte{"east": rsKubeconfig("https://a.example")})
	f.wait("east from a", func() bool { return f.host("east") == "https://a.example" })
	f.put("b", map[string][]byte{"east": rsKubeconfig("https://b.example")})
	f.wait("b refused", func() bool { return f.refused("duplicate_cluster_id") == 1 })

	// a's new kubeconfig runs a command: its cluster goes, and b's, which
	// is acceptable, takes the id.
	f.put("a", map[string][]byte{"east": testKubeconfig("https://a.example", "", "    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: /bin/sh}")})
	f.wait("a refused", func() bool { return f.refused("exec") == 1 })
	f.wait("east from b", func() bool { return f.host("east") == "https://b.example" })
}
