package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mesh is two nodes, a ztunnel Pod on each, and workloads.
type mesh struct {
	s            *server
	system, apps string
	ztunnelA     *harness.Workload
	ztunnelB     *harness.Workload
}

func newMesh(t testing.TB, extra ...string) *mesh {
	t.Helper()
	system := cluster.Namespace(t, "istio-system")
	m := &mesh{apps: cluster.Namespace(t, "apps"), system: system}
	// --node-proxy-deny's default, with the test's istio-system; extra
	// entries add to it.
	m.s = startServer(t, append([]string{"--trusted-node-accounts", system + "/ztunnel",
		"--node-proxy-deny", "kube-system," + system + "/istiod"}, extra...)...)
	m.ztunnelA = cluster.NewWorkload(t, system, "ztunnel", "node-a")
	cluster.Pod(t, system, "ztunnel-b", "ztunnel", "node-b")
	m.ztunnelB = &harness.Workload{Namespace: system, ServiceAccount: "ztunnel", Pod: "ztunnel-b", Node: "node-b",
		Token: cluster.Token(t, system, "ztunnel", "ztunnel-b", []string{"istio-ca"}, time.Hour)}
	return m
}

func (m *mesh) id(sa string) spiffeid.ID {
	return spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", m.apps, "sa", sa)
}

func (m *mesh) impersonate(t *testing.T, token string, id string) error {
	t.Helper()
	parsed, err := spiffeid.FromString(id)
	if err != nil {
		// Send malformed IDs as they are, with a CSR for a valid one.
		parsed = m.id("placeholder")
	}
	c := m.s.client(t, token)
	csrPEM := newCSR(t, parsed)
	_, err = c.Call(context.Background(), csrPEM, parsed, caclient.Options{Impersonate: true, ImpersonatedIdentity: id})
	return err
}

func TestImpersonation(t *testing.T) {
	m := newMesh(t)
	cluster.NewWorkload(t, m.apps, "web", "node-a")
	cluster.NewWorkload(t, m.apps, "db", "node-b")
	cluster.ServiceAccount(t, m.apps, "batch")
	failed := cluster.Pod(t, m.apps, "batch-0", "batch", "node-a")
	failed.Status.Phase = corev1.PodFailed
	if _, err := cluster.Client.CoreV1().Pods(m.apps).UpdateStatus(context.Background(), failed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	untrusted := cluster.NewWorkload(t, m.apps, "nosy", "node-a")

	t.Run("workload on the node gets exactly its SVID", func(t *testing.T) {
		svid, err := m.s.client(t, m.ztunnelA.Token).Fetch(context.Background(), m.id("web"), caclient.Options{Impersonate: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(svid.Chain[0].URIs) != 1 || svid.Chain[0].URIs[0].String() != m.id("web").String() {
			t.Fatalf("URIs %v", svid.Chain[0].URIs)
		}
	})
	tests := []struct {
		name   string
		token  string
		id     string
		code   codes.Code
		reason string
	}{
		{"workload only on another node", m.ztunnelA.Token, m.id("db").String(), codes.PermissionDenied, "not_on_node"},
		{"other node's ztunnel may", m.ztunnelB.Token, m.id("db").String(), codes.OK, ""},
		{"untrusted service account", untrusted.Token, m.id("web").String(), codes.PermissionDenied, "untrusted_caller"},
		{"foreign trust domain", m.ztunnelA.Token, "spiffe://evil.example/ns/" + m.apps + "/sa/web", codes.PermissionDenied, "foreign_trust_domain"},
		{"malformed identity", m.ztunnelA.Token, "spiffe://cluster.local/web", codes.InvalidArgument, "malformed_identity"},
		{"two identities", m.ztunnelA.Token, m.id("web").String() + "," + m.id("db").String(), codes.InvalidArgument, "malformed_identity"},
		{"failed Pod does not authorize", m.ztunnelA.Token, m.id("batch").String(), codes.PermissionDenied, "not_on_node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := m.impersonate(t, tt.token, tt.id)
			if status.Code(err) != tt.code {
				t.Fatalf("got %v, want %v", err, tt.code)
			}
			if tt.code != codes.OK && strings.Contains(status.Convert(err).Message(), tt.reason) {
				t.Errorf("wire message %q carries the internal reason", status.Convert(err).Message())
			}
			if tt.reason != "" && !m.s.WaitForLog(5*time.Second, `"reason":"`+tt.reason+`"`) {
				t.Errorf("log lacks reason %s", tt.reason)
			}
		})
	}
	t.Run("unknown clusterid", func(t *testing.T) {
		c, err := checked.NewClient(t, caclient.Config{Addr: m.s.Addr, ServerName: "istiod.istio-system.svc", Roots: m.s.roots,
			TokenFile: harness.WriteToken(t, m.ztunnelA.Token), ClusterID: "elsewhere"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Fetch(context.Background(), m.id("web"), caclient.Options{Impersonate: true})
		if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), `unknown cluster "elsewhere"`) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("workload created just before the request", func(t *testing.T) {
		cluster.ServiceAccount(t, m.apps, "fresh")
		cluster.Pod(t, m.apps, "fresh-0", "fresh", "node-a")
		if _, err := m.s.client(t, m.ztunnelA.Token).Fetch(context.Background(), m.id("fresh"), caclient.Options{Impersonate: true}); err != nil {
			t.Fatalf("a Pod scheduled a moment ago was denied: %v", err)
		}
	})
}

// TestImpersonationCallerPodLifecycle: a ztunnel whose Pod is deleted or
// replaced loses its power at once, even though its token has not expired
// and the apiserver still caches its review.
func TestImpersonationCallerPodLifecycle(t *testing.T) {
	m := newMesh(t)
	cluster.NewWorkload(t, m.apps, "web", "node-a")
	if err := m.impersonate(t, m.ztunnelA.Token, m.id("web").String()); err != nil {
		t.Fatal(err)
	}
	cluster.DeletePod(t, m.system, m.ztunnelA.Pod)
	waitCode(t, func() error { return m.impersonate(t, m.ztunnelA.Token, m.id("web").String()) }, codes.Unauthenticated)

	// The same name again: a new UID; the old token must stay refused,
	// whatever the apiserver says of it: meshca saw its Pod deleted
	// (token_bound_object_gone), or the Pod of that name is another one
	// (caller_uid_mismatch).
	cluster.Pod(t, m.system, m.ztunnelA.Pod, "ztunnel", "node-a")
	mark := m.s.LogMark()
	waitCode(t, func() error { return m.impersonate(t, m.ztunnelA.Token, m.id("web").String()) }, codes.Unauthenticated)
	if !m.s.WaitForLogAfter(mark, 10*time.Second, `"reason":"token_bound_object_gone"`) && !m.s.WaitForLogAfter(mark, time.Second, `"reason":"caller_uid_mismatch"`) {
		t.Errorf("the refusal after the Pod came back gave neither token_bound_object_gone nor caller_uid_mismatch")
	}
}

func waitCode(t *testing.T, f func() error, want codes.Code) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if status.Code(err) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %v after 20s, want %v", err, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestTokenReviewCount: 1,000 impersonated requests with one ztunnel token
// cost the apiserver at most one TokenReview per minute.
func TestTokenReviewCount(t *testing.T) {
	m := newMesh(t)
	const workloads = 20
	for i := range workloads {
		cluster.ServiceAccount(t, m.apps, fmt.Sprintf("svc-%d", i))
		cluster.Pod(t, m.apps, fmt.Sprintf("svc-%d-0", i), fmt.Sprintf("svc-%d", i), "node-a")
	}
	c := m.s.client(t, m.ztunnelA.Token)
	before := tokenReviews(t)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	sem := make(chan struct{}, 16)
	for i := range 1000 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := c.Fetch(context.Background(), m.id(fmt.Sprintf("svc-%d", i%workloads)), caclient.Options{Impersonate: true})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	reviews := tokenReviews(t) - before
	allowed := int(elapsed/time.Minute) + 1
	harness.Report(t, "1000 impersonated requests in %v, %d TokenReviews", elapsed.Round(time.Millisecond), reviews)
	if reviews > allowed {
		t.Fatalf("%d TokenReviews for one token in %v, want at most %d", reviews, elapsed, allowed)
	}
}

var tokenReviewLine = regexp.MustCompile(`(?m)^apiserver_request_total\{[^}]*resource="tokenreviews"[^}]*\} (\d+)`)

// tokenReviews reads the apiserver's own count of TokenReview requests.
func tokenReviews(t *testing.T) int {
	t.Helper()
	body, err := cluster.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range tokenReviewLine.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// TestExplain: `meshca explain` walks the same checks against the real
// cluster and ends with the code a real request gets.
func TestExplain(t *testing.T) {
	m := newMesh(t)
	cluster.NewWorkload(t, m.apps, "web", "node-a")
	cluster.NewWorkload(t, m.apps, "db", "node-b")
	tokenFile := harness.WriteToken(t, m.ztunnelA.Token)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"allowed", []string{"--token-file", tokenFile, "--identity", m.id("web").String()},
			[]string{"authenticate (TokenReview)", "caller pod", "workload on node", "result: OK"}},
		{"other node", []string{"--token-file", tokenFile, "--identity", m.id("db").String()},
			[]string{"FAIL: not_on_node", "result: PermissionDenied (not_on_node)"}},
		{"untrusted caller by name", []string{"--namespace", m.apps, "--service-account", "web", "--identity", m.id("db").String()},
			[]string{"FAIL: untrusted_caller", "result: PermissionDenied (untrusted_caller)"}},
		{"garbage token", []string{"--token-file", harness.WriteToken(t, "nope"), "--identity", m.id("web").String()},
			[]string{"result: Unauthenticated (token_malformed)"}},
		{"forged token", []string{"--token-file", harness.WriteToken(t, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"), "--identity", m.id("web").String()},
			[]string{"result: Unauthenticated (token_invalid)"}},
		{"meshca's own account", []string{"--token-file", tokenFile, "--ca-service-account", m.system + "/meshca",
			"--identity", "spiffe://cluster.local/ns/" + m.system + "/sa/meshca"},
			[]string{"FAIL: impersonation_denied_identity", "it is this CA's own identity", "result: PermissionDenied (impersonation_denied_identity)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"explain", "--kubeconfig", cluster.Kubeconfig, "--trusted-node-accounts", m.system + "/ztunnel"}, tt.args...)
			out, err := exec.Command(bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("meshca explain: %v\n%s", err, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}
