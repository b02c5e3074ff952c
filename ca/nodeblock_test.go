package ca_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca"
	"github.com/meshca/meshca/ca/kube"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// nodePods is a PodSource of one ztunnel and one workload on each of
// node-a and node-b.
type nodePods map[string]kube.PodInfo

func (p nodePods) Pod(_ context.Context, ns, name string) (*kube.PodInfo, error) {
	if pi, ok := p[ns+"/"+name]; ok {
		return &pi, nil
	}
	return nil, nil
}

func (p nodePods) OnNode(_ context.Context, ns, sa, node string) ([]kube.PodInfo, error) {
	var out []kube.PodInfo
	for _, pi := range p {
		if pi.Namespace == ns && pi.ServiceAccount == sa && pi.Node == node {
			out = append(out, pi)
		}
	}
	return out, nil
}

func (p nodePods) OfAccount(_ context.Context, ns, sa string) ([]kube.PodInfo, error) {
	return nil, nil
}

// blocks is a NodeBlocks in memory.
type blocks map[string]keymgr.NodeBlock

func (b blocks) NodeBlocked(node string) (keymgr.NodeBlock, bool) {
	nb, ok := b[node]
	return nb, ok
}

// TestNodeBlock: the proxy of a node blocked by a revocation gets no
// certificate, for a workload of its node or for itself, nor does a
// workload whose token is bound to a Pod on that node, with a message
// that names the block and how to lift it, a metric label and the detail
// in the audit event; other nodes' proxies and workloads are served, and
// every issued leaf's event names its issuer and the proxy's node.
func TestNodeBlock(t *testing.T) {
	root := testca.NewRoot(t, "root", testca.Options{})
	inter := root.NewIntermediate(t, "inter", testca.Options{})
	rec := &recorder{}
	ztunnel := spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/ztunnel")
	web := spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/web")
	db := spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/db")
	pods := nodePods{
		"istio-system/ztunnel-a": {Namespace: "istio-system", Name: "ztunnel-a", UID: "za", ServiceAccount: "ztunnel", Node: "node-a"},
		"istio-system/ztunnel-b": {Namespace: "istio-system", Name: "ztunnel-b", UID: "zb", ServiceAccount: "ztunnel", Node: "node-b"},
		"prod/web-a":             {Namespace: "prod", Name: "web-a", UID: "wa", ServiceAccount: "web", Node: "node-a"},
		"prod/db-b":              {Namespace: "prod", Name: "db-b", UID: "db", ServiceAccount: "db", Node: "node-b"},
	}
	callers := tokens{
		// node-a's ztunnel: its node from its Pod (no node-name extra).
		"ztunnel-a": {ID: ztunnel, Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-a", PodUID: "za", Method: "token"},
		"ztunnel-b": {ID: ztunnel, Namespace: "istio-system", ServiceAccount: "ztunnel", PodName: "ztunnel-b", PodUID: "zb", Node: "node-b", Method: "token"},
		"web-a":     {ID: web, Namespace: "prod", ServiceAccount: "web", PodName: "web-a", PodUID: "wa", Node: "node-a", Method: "token"},
		"db-b":      {ID: db, Namespace: "prod", ServiceAccount: "db", PodName: "db-b", PodUID: "db", Node: "node-b", Method: "token"},
	}
	at := time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)
	f := newFixture(t, inter.Authority(), options{config: func(c *ca.Config) {
		c.Audit = rec
		c.Clusters = ca.NewClusterSet(&ca.Cluster{ID: "Kubernetes", Authenticators: []ca.Authenticator{callers},
			Authorizer: &ca.NodeAuthorizer{TrustDomain: td, TrustedNodeAccounts: map[string]bool{"istio-system/ztunnel": true}, Pods: pods}})
		c.NodeBlocks = blocks{"node-a": {Node: "node-a", At: at, Reason: "stolen", By: "alice"}}
	}})
	issuer := keymgr.Fingerprint(inter.Cert)
	tests := []struct {
		name, token string
		id          spiffeid.ID
		impersonate string
		code        codes.Code
		msg         string
		proxyNode   string
	}{
		{name: "blocked node's proxy for a workload of its node", token: "ztunnel-a", id: web, impersonate: web.String(), code: codes.PermissionDenied,
			msg: "node node-a is blocked by a revocation since 2026-12-06T23:00:00Z; an operator lifts it with meshca revoke --node node-a --undo", proxyNode: "node-a"},
		{name: "blocked node's proxy for itself", token: "ztunnel-a", id: ztunnel, code: codes.PermissionDenied, msg: "node node-a is blocked", proxyNode: "node-a"},
		{name: "another node's proxy", token: "ztunnel-b", id: db, impersonate: db.String(), code: codes.OK, proxyNode: "node-b"},
		{name: "a workload of the blocked node for itself", token: "web-a", id: web, code: codes.PermissionDenied, msg: "node node-a is blocked"},
		{name: "a workload of another node for itself", token: "db-b", id: db, code: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, _, err := call(t, f, metadata.Pairs("authorization", "Bearer "+tt.token), tt.id, tt.impersonate)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Fatalf("err = %v, want %v %q", err, tt.code, tt.msg)
			}
			e := rec.last(t)
			if e.ProxyNode != tt.proxyNode {
				t.Errorf("audited proxy node %q, want %q", e.ProxyNode, tt.proxyNode)
			}
			if tt.code != codes.OK {
				if e.Reason != "node_blocked" || !strings.Contains(e.Detail, `by "alice" (reason "stolen")`) || e.Issuer != "" {
					t.Errorf("audited reason %q detail %q issuer %q", e.Reason, e.Detail, e.Issuer)
				}
				return
			}
			leaf, err := pemutil.ParseCertificates([]byte(resp.GetCertChain()[0]))
			if err != nil {
				t.Fatal(err)
			}
			if e.Issuer != issuer || e.Serial != leaf[0].SerialNumber.Text(16) {
				t.Errorf("audited issuer %.16s serial %s, want %.16s %s", e.Issuer, e.Serial, issuer, leaf[0].SerialNumber.Text(16))
			}
		})
	}
	wantSample(t, f.reg, "meshca_requests_total", map[string]string{"code": "PermissionDenied", "reason": "node_blocked"}, 3)
}
