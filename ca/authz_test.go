package ca

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/kube"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
)

// pods is a pure in-memory PodSource.
type pods struct {
	byName map[string]kube.PodInfo
	err    error
}

func (p pods) Pod(_ context.Context, ns, name string) (*kube.PodInfo, error) {
	if p.err != nil {
		return nil, p.err
	}
	if pi, ok := p.byName[ns+"/"+name]; ok {
		return &pi, nil
	}
	return nil, nil
}

func (p pods) OnNode(_ context.Context, ns, sa, node string) ([]kube.PodInfo, error) {
	if p.err != nil {
		return nil, p.err
	}
	var out []kube.PodInfo
	for _, pi := range p.byName {
		if pi.Namespace == ns && pi.ServiceAccount == sa && pi.Node == node && !pi.Terminated {
			out = append(out, pi)
		}
	}
	return out, nil
}

func (p pods) OfAccount(_ context.Context, ns, sa string) ([]kube.PodInfo, error) {
	if p.err != nil {
		return nil, p.err
	}
	var out []kube.PodInfo
	for _, pi := range p.byName {
		if pi.Namespace == ns && pi.ServiceAccount == sa && pi.Live() {
			out = append(out, pi)
		}
	}
	return out, nil
}

func TestNodeAuthorizer(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	cluster := pods{byName: map[string]kube.PodInfo{
		"istio-system/ztunnel-a":    {Namespace: "istio-system", Name: "ztunnel-a", UID: "za", ServiceAccount: "ztunnel", Node: "node-a"},
		"prod/web-a":                {Namespace: "prod", Name: "web-a", UID: "wa", ServiceAccount: "web", Node: "node-a"},
		"prod/db-b":                 {Namespace: "prod", Name: "db-b", UID: "db", ServiceAccount: "db", Node: "node-b"},
		"prod/batch-a":              {Namespace: "prod", Name: "batch-a", UID: "ba", ServiceAccount: "batch", Node: "node-a", Terminated: true},
		"prod/job-a":                {Namespace: "prod", Name: "job-a", UID: "ja", ServiceAccount: "job", Node: "node-a", Terminated: true},
		"prod/drain-a":              {Namespace: "prod", Name: "drain-a", UID: "da", ServiceAccount: "drain", Node: "node-a", Deleting: true},
		"istio-system/ztunnel-done": {Namespace: "istio-system", Name: "ztunnel-done", UID: "zd", ServiceAccount: "ztunnel", Node: "node-a", Terminated: true},
		"istio-system/ztunnel-del":  {Namespace: "istio-system", Name: "ztunnel-del", UID: "zx", ServiceAccount: "ztunnel", Node: "node-a", Deleting: true},
		"istio-system/istiod-a":     {Namespace: "istio-system", Name: "istiod-a", UID: "ia", ServiceAccount: "istiod", Node: "node-a"},
		"istio-system/gateway-a":    {Namespace: "istio-system", Name: "gateway-a", UID: "ga", ServiceAccount: "gateway", Node: "node-a"},
		"kube-system/kube-proxy-a":  {Namespace: "kube-system", Name: "kube-proxy-a", UID: "ka", ServiceAccount: "kube-proxy", Node: "node-a"},
		"istio-system/istiod-c-a":   {Namespace: "istio-system", Name: "istiod-c-a", UID: "ic", ServiceAccount: "istiod-canary", Node: "node-a"},
		"istio-system/istiod-r-a":   {Namespace: "istio-system", Name: "istiod-r-a", UID: "ir", ServiceAccount: "istiod-1-24-0", Node: "node-a"},
		"istio-system/istiodx-a":    {Namespace: "istio-system", Name: "istiodx-a", UID: "ix", ServiceAccount: "istiodx", Node: "node-a"},
		"istio-system/meshca-a":     {Namespace: "istio-system", Name: "meshca-a", UID: "ma", ServiceAccount: "meshca", Node: "node-a"},
	}}
	deny, err := ParseNodeProxyDeny(DefaultNodeProxyDeny())
	if err != nil {
		t.Fatal(err)
	}
	if deny, err = deny.WithOwn("istio-system", "meshca"); err != nil {
		t.Fatal(err)
	}
	istiod := Caller{ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/istiod"), Namespace: "istio-system",
		ServiceAccount: "istiod", PodName: "istiod-a", PodUID: "ia", Method: "token"}
	ztunnel := Caller{ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/ztunnel"), Namespace: "istio-system",
		ServiceAccount: "ztunnel", PodName: "ztunnel-a", PodUID: "za", Method: "token"}
	web := Caller{ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/web"), Namespace: "prod", ServiceAccount: "web",
		PodName: "web-a", PodUID: "wa", Method: "token"}
	with := func(c Caller, f func(*Caller)) Caller { f(&c); return c }
	renewing := func(ns, sa string) Caller {
		return Caller{ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/" + ns + "/sa/" + sa), Namespace: ns, ServiceAccount: sa, Method: MethodCertificate}
	}
	tests := []struct {
		name      string
		caller    Caller
		requested string
		pods      PodSource
		want      string
		kind      codes.Code
		reason    string
	}{
		{name: "own identity", caller: web, want: web.ID.String()},
		{name: "own identity, pod gone", caller: with(web, func(c *Caller) { c.PodName = "web-gone" }), kind: codes.Unauthenticated, reason: "caller_pod_missing"},
		{name: "own identity, pod replaced", caller: with(web, func(c *Caller) { c.PodUID = "old" }), kind: codes.Unauthenticated, reason: "caller_uid_mismatch"},
		{name: "ztunnel for a workload on its node", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web", want: "spiffe://cluster.local/ns/prod/sa/web"},
		{name: "node from the token extra", caller: with(ztunnel, func(c *Caller) { c.Node = "node-b" }), requested: "spiffe://cluster.local/ns/prod/sa/db", want: "spiffe://cluster.local/ns/prod/sa/db"},
		{name: "workload on another node", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/db", kind: codes.PermissionDenied, reason: "not_on_node"},
		{name: "failed pod does not count", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/batch", kind: codes.PermissionDenied, reason: "not_on_node"},
		{name: "untrusted caller", caller: web, requested: "spiffe://cluster.local/ns/prod/sa/db", kind: codes.PermissionDenied, reason: "untrusted_caller"},
		{name: "foreign trust domain", caller: ztunnel, requested: "spiffe://evil.example/ns/prod/sa/web", kind: codes.PermissionDenied, reason: "foreign_trust_domain"},
		{name: "malformed", caller: ztunnel, requested: "spiffe://cluster.local/web", kind: codes.InvalidArgument, reason: "malformed_identity"},
		{name: "not a spiffe id", caller: ztunnel, requested: "web.prod", kind: codes.InvalidArgument, reason: "malformed_identity"},
		{name: "two ids", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web,spiffe://cluster.local/ns/prod/sa/db", kind: codes.InvalidArgument, reason: "malformed_identity"},
		{name: "token not bound to a pod", caller: with(ztunnel, func(c *Caller) { c.PodName, c.PodUID = "", "" }), requested: "spiffe://cluster.local/ns/prod/sa/web", kind: codes.PermissionDenied, reason: "caller_not_pod_bound"},
		{name: "ztunnel pod deleted", caller: with(ztunnel, func(c *Caller) { c.PodName = "ztunnel-old" }), requested: "spiffe://cluster.local/ns/prod/sa/web", kind: codes.Unauthenticated, reason: "caller_pod_missing"},
		{name: "index not synced", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web", pods: pods{err: kube.ErrNotSynced}, kind: codes.Unavailable, reason: "pod_index_not_synced"},
		{name: "apiserver down", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web", pods: pods{err: errors.New("connection refused")}, kind: codes.Unavailable, reason: "pod_lookup_failed"},
		{name: "apiserver silent until the deadline", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web", pods: pods{err: fmt.Errorf("list pods: %w", context.DeadlineExceeded)}, kind: codes.Unavailable, reason: "pod_lookup_failed"},
		{name: "certificate renewal, apiserver silent until the deadline", caller: renewing("prod", "web"), pods: pods{err: context.DeadlineExceeded}, kind: codes.Unavailable, reason: "pod_lookup_failed"},
		{name: "the node's share of lookups spent", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web",
			pods: pods{err: &kube.LookupBudgetError{Node: "node-a", RetryAfter: 200 * time.Millisecond}}, kind: codes.ResourceExhausted, reason: "node_pod_lookups"},
		{name: "client gone during the lookup", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/web", pods: pods{err: context.Canceled}, kind: codes.Canceled, reason: "canceled"},
		{name: "asking for itself", caller: web, requested: web.ID.String(), want: web.ID.String()},
		{name: "terminated ztunnel pod", caller: with(ztunnel, func(c *Caller) { c.PodName, c.PodUID = "ztunnel-done", "zd" }), requested: "spiffe://cluster.local/ns/prod/sa/web", kind: codes.Unauthenticated, reason: "caller_pod_terminated"},
		{name: "ztunnel pod being deleted, still draining", caller: with(ztunnel, func(c *Caller) { c.PodName, c.PodUID = "ztunnel-del", "zx" }),
			requested: "spiffe://cluster.local/ns/prod/sa/web", want: "spiffe://cluster.local/ns/prod/sa/web"},
		{name: "succeeded pod does not count", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/job", kind: codes.PermissionDenied, reason: "not_on_node"},
		{name: "own identity, its Pod being deleted, still draining", caller: Caller{ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/prod/sa/drain"),
			Namespace: "prod", ServiceAccount: "drain", PodName: "drain-a", PodUID: "da", Method: "token"}, want: "spiffe://cluster.local/ns/prod/sa/drain"},
		{name: "certificate renewal, the account's only Pod draining", caller: renewing("prod", "drain"), want: "spiffe://cluster.local/ns/prod/sa/drain"},
		{name: "draining pod still counts", caller: ztunnel, requested: "spiffe://cluster.local/ns/prod/sa/drain", want: "spiffe://cluster.local/ns/prod/sa/drain"},
		{name: "certificate renewal with a live pod", caller: renewing("prod", "web"), want: "spiffe://cluster.local/ns/prod/sa/web"},
		{name: "certificate renewal, workload gone", caller: renewing("prod", "gone"), kind: codes.Unauthenticated, reason: "cert_workload_gone"},
		{name: "certificate renewal, only a terminated pod", caller: renewing("prod", "batch"), kind: codes.Unauthenticated, reason: "cert_workload_gone"},
		{name: "certificate renewal, index not synced", caller: renewing("prod", "web"), pods: pods{err: kube.ErrNotSynced}, kind: codes.Unavailable, reason: "pod_index_not_synced"},
		// Issue 22: a node proxy may not take the control plane's
		// identities, although their Pods run on its node.
		{name: "ztunnel for istiod on its node, a denied account", caller: ztunnel, requested: "spiffe://cluster.local/ns/istio-system/sa/istiod",
			kind: codes.PermissionDenied, reason: "impersonation_denied_identity"},
		{name: "ztunnel for kube-system on its node, a denied namespace", caller: ztunnel, requested: "spiffe://cluster.local/ns/kube-system/sa/kube-proxy",
			kind: codes.PermissionDenied, reason: "impersonation_denied_identity"},
		{name: "ztunnel for a denied identity with no Pod anywhere: no lookup decides", caller: ztunnel, requested: "spiffe://cluster.local/ns/kube-system/sa/ghost",
			pods: pods{err: kube.ErrNotSynced}, kind: codes.PermissionDenied, reason: "impersonation_denied_identity"},
		{name: "ztunnel for another account of istio-system on its node", caller: ztunnel, requested: "spiffe://cluster.local/ns/istio-system/sa/gateway",
			want: "spiffe://cluster.local/ns/istio-system/sa/gateway"},
		{name: "ztunnel's own identity through ImpersonatedIdentity", caller: ztunnel, requested: ztunnel.ID.String(), want: ztunnel.ID.String()},
		{name: "untrusted caller for a denied identity", caller: web, requested: "spiffe://cluster.local/ns/istio-system/sa/istiod",
			kind: codes.PermissionDenied, reason: "untrusted_caller"},
		// Issue 28: istiod of any revision, and the CA's own account,
		// whatever --node-proxy-deny says.
		{name: "ztunnel for a revisioned istiod on its node", caller: ztunnel, requested: "spiffe://cluster.local/ns/istio-system/sa/istiod-canary",
			kind: codes.PermissionDenied, reason: "impersonation_denied_identity"},
		{name: "ztunnel for a version-revisioned istiod on its node", caller: ztunnel, requested: "spiffe://cluster.local/ns/istio-system/sa/istiod-1-24-0",
			kind: codes.PermissionDenied, reason: "impersonation_denied_identity"},
		{name: "ztunnel for an account that only begins like istiod's", caller: ztunnel, requested: "spiffe://cluster.local/ns/istio-system/sa/istiodx",
			want: "spiffe://cluster.local/ns/istio-system/sa/istiodx"},
		{name: "ztunnel for the CA's own account on its node", caller: ztunnel, requested: "spiffe://cluster.local/ns/istio-system/sa/meshca",
			kind: codes.PermissionDenied, reason: "impersonation_denied_identity"},
		{name: "the CA's own account for itself, by its own token", caller: Caller{ID: spiffeid.RequireFromString("spiffe://cluster.local/ns/istio-system/sa/meshca"),
			Namespace: "istio-system", ServiceAccount: "meshca", PodName: "meshca-a", PodUID: "ma", Method: "token"}, want: "spiffe://cluster.local/ns/istio-system/sa/meshca"},
		{name: "istiod for itself, by its own token", caller: istiod, want: istiod.ID.String()},
		{name: "istiod for itself through ImpersonatedIdentity", caller: istiod, requested: istiod.ID.String(), want: istiod.ID.String()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.pods
			if src == nil {
				src = cluster
			}
			a := &NodeAuthorizer{TrustDomain: td, TrustedNodeAccounts: map[string]bool{"istio-system/ztunnel": true}, Pods: src, NodeProxyDeny: deny}
			c := tt.caller
			got, err := a.Authorize(context.Background(), &c, tt.requested)
			if tt.want != "" {
				if err != nil || got.String() != tt.want {
					t.Fatalf("got %v, %v; want %s", got, err, tt.want)
				}
				return
			}
			if o := classify(err); err == nil || o.Code != tt.kind || o.Reason != tt.reason {
				t.Fatalf("err = %v, want code %v reason %s", err, tt.kind, tt.reason)
			}
		})
	}
}

func TestParseNodeAccounts(t *testing.T) {
	got, err := ParseNodeAccounts([]string{"istio-system/ztunnel", " kube-system/proxy "})
	if err != nil || !got["istio-system/ztunnel"] || !got["kube-system/proxy"] {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"ztunnel", "/x", "a/b/c"} {
		if _, err := ParseNodeAccounts([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestParseNodeProxyDeny: namespaces, accounts and account prefixes
// ("ns/prefix*") are read, spaces trimmed and empty entries skipped; what
// is none of them is refused, saying why.
func TestParseNodeProxyDeny(t *testing.T) {
	got, err := ParseNodeProxyDeny([]string{"kube-system", " istio-system/istiod ", "", "mesh/meshca.v2", "istio-system/istiod-*", "ops/a.*"})
	want := []string{"istio-system/istiod", "istio-system/istiod-*", "kube-system", "mesh/meshca.v2", "ops/a.*"}
	if err != nil || !slices.Equal(got.Entries(), want) {
		t.Fatalf("got %q, %v; want %q", got.Entries(), err, want)
	}
	if got, err := ParseNodeProxyDeny(DefaultNodeProxyDeny()); err != nil || len(got.Entries()) != 3 {
		t.Fatalf("the default: %v, %v", got.Entries(), err)
	}
	for _, tt := range []struct{ entry, err string }{
		{"/x", "neither a namespace nor namespace/serviceaccount"},
		{"ns/", "neither a namespace nor namespace/serviceaccount"},
		{"a/b/c", "neither a namespace nor namespace/serviceaccount"},
		{"Kube-System", "neither a namespace nor namespace/serviceaccount"},
		{"kube_system", "neither a namespace nor namespace/serviceaccount"},
		{"ns/Istiod", "neither a namespace nor namespace/serviceaccount"},
		{"*", "neither a namespace nor namespace/serviceaccount"},
		{"istio-*", "neither a namespace nor namespace/serviceaccount"},
		{"*/istiod", "neither a namespace nor namespace/serviceaccount"},
		{"ns/*", `a namespace alone, "ns", denies every account of it`},
		{"ns/istiod-*-x", "neither a namespace nor namespace/serviceaccount"},
		{"ns/*istiod", "neither a namespace nor namespace/serviceaccount (nor namespace/prefix*)"},
		{"ns/a**", `"a*" does not begin a service account's name`},
		{"ns/-a*", `"-a" does not begin a service account's name`},
		{"ns/Istiod-*", `"Istiod-" does not begin a service account's name`},
	} {
		if _, err := ParseNodeProxyDeny([]string{tt.entry}); err == nil || !strings.Contains(err.Error(), tt.err) {
			t.Errorf("%q: %v, want %q", tt.entry, err, tt.err)
		}
	}
}

// TestDenyListMatch: an account is denied by its own entry, its
// namespace's, the longest prefix of its namespace that begins its name,
// or as the CA's own, which WithOwn adds to a copy; nothing else is, and
// a nil list denies nothing.
func TestDenyListMatch(t *testing.T) {
	base, err := ParseNodeProxyDeny([]string{"kube-system", "istio-system/istiod", "istio-system/istiod-*", "istio-system/istiod-can*"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := base.WithOwn("mesh", "meshca")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		ns, sa, entry string
		own           bool
	}{
		{"kube-system", "coredns", "kube-system", false},
		{"istio-system", "istiod", "istio-system/istiod", false},
		{"istio-system", "istiod-1-24-0", "istio-system/istiod-*", false},
		{"istio-system", "istiod-canary", "istio-system/istiod-can*", false},
		{"istio-system", "istiod-", "istio-system/istiod-*", false},
		{"mesh", "meshca", "mesh/meshca", true},
		{"istio-system", "istiodx", "", false},
		{"istio-system", "ztunnel", "", false},
		{"other", "istiod-canary", "", false},
		{"mesh", "meshca-canary", "", false},
	}
	for _, tt := range tests {
		entry, own, ok := d.match(tt.ns, tt.sa)
		if entry != tt.entry || own != tt.own || ok != (tt.entry != "") {
			t.Errorf("%s/%s: %q own %v ok %v; want %q own %v", tt.ns, tt.sa, entry, own, ok, tt.entry, tt.own)
		}
	}
	if _, _, ok := base.match("mesh", "meshca"); ok {
		t.Error("WithOwn changed the list it was called on")
	}
	if _, _, ok := (*DenyList)(nil).match("kube-system", "coredns"); ok {
		t.Error("a nil list denies")
	}
	if _, err := base.WithOwn("Mesh", "meshca"); err == nil {
		t.Error("an own account that is no namespace/serviceaccount accepted")
	}
	if got := d.Own(); !slices.Equal(got, []string{"mesh/meshca"}) {
		t.Errorf("Own() = %q", got)
	}
}

// TestNodeProxyDenyMessage: the refusal names the identity and the entry
// that denies it, and says what the workload must do instead.
func TestNodeProxyDenyMessage(t *testing.T) {
	deny, err := ParseNodeProxyDeny([]string{"kube-system", "istio-system/istiod-*"})
	if err != nil {
		t.Fatal(err)
	}
	if deny, err = deny.WithOwn("istio-system", "meshca"); err != nil {
		t.Fatal(err)
	}
	a := &NodeAuthorizer{NodeProxyDeny: deny}
	for _, tt := range []struct {
		id   string
		want []string
	}{
		{"spiffe://cluster.local/ns/kube-system/sa/coredns",
			[]string{"node proxies may not request spiffe://cluster.local/ns/kube-system/sa/coredns", "--node-proxy-deny lists kube-system;", "its own token"}},
		{"spiffe://cluster.local/ns/istio-system/sa/istiod-canary",
			[]string{"node proxies may not request spiffe://cluster.local/ns/istio-system/sa/istiod-canary", "--node-proxy-deny lists istio-system/istiod-*;"}},
		{"spiffe://cluster.local/ns/istio-system/sa/meshca",
			[]string{"node proxies may not request spiffe://cluster.local/ns/istio-system/sa/meshca: it is this CA's own identity"}},
	} {
		o := classify(a.denied(spiffeid.RequireFromString(tt.id)))
		for _, w := range tt.want {
			if !strings.Contains(o.Msg, w) {
				t.Errorf("message %q lacks %q", o.Msg, w)
			}
		}
		if o.Code != codes.PermissionDenied || o.Reason != "impersonation_denied_identity" {
			t.Errorf("outcome %+v", o)
		}
	}
}
