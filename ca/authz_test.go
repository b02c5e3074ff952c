package ca

import (
	"context"
	"errors"
	"fmt"
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
	}}
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := tt.pods
			if src == nil {
				src = cluster
			}
			a := &NodeAuthorizer{TrustDomain: td, TrustedNodeAccounts: map[string]bool{"istio-system/ztunnel": true}, Pods: src}
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
