package kube

import (
	"context"
	"encoding/json"
	"testing"
	"time"
)

// indexFake is a Pod index: Pods by namespace/name.
type indexFake map[string]*PodInfo

func (x indexFake) Indexed(ns, name string) (*PodInfo, bool) {
	p, ok := x[ns+"/"+name]
	return p, ok
}

// boundToken is a token of Pod shop/cart-7d9f (UID pod-uid-1, service
// account cart) for istio-ca, as the kubelet projects it; change edits
// its claims first.
func boundToken(t *testing.T, change func(c map[string]any)) string {
	t.Helper()
	k8s := map[string]any{"namespace": "shop", "serviceaccount": map[string]any{"name": "cart", "uid": "sa-uid"},
		"pod": map[string]any{"name": "cart-7d9f", "uid": "pod-uid-1"}, "node": map[string]any{"name": "node-a", "uid": "n"}}
	c := map[string]any{"aud": []string{"istio-ca"}, "exp": time.Unix(2e9, 0).Unix(), "iat": time.Unix(2e9-3600, 0).Unix(),
		"iss": "https://kubernetes.default.svc.cluster.local", "sub": "system:serviceaccount:shop:cart", "kubernetes.io": k8s}
	if change != nil {
		change(c)
	}
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return fuzzJWT(string(b))
}

// TestPlausibility (issue 28, item 3): a token is plausible only when it
// reads as the bound token of a Pod the index holds live, with the same
// UID and service account, for the CA's audience and not expired; its
// subject is the cluster and the Pod's UID. Anything else (a legacy or
// unbound token, another audience, an expired token, a Pod the index
// does not hold, another UID or service account, a terminated Pod, not a
// JWT) is not.
func TestPlausibility(t *testing.T) {
	live := &PodInfo{Namespace: "shop", Name: "cart-7d9f", UID: "pod-uid-1", ServiceAccount: "cart", Node: "node-a"}
	k8s := func(c map[string]any) map[string]any { return c["kubernetes.io"].(map[string]any) }
	tests := []struct {
		name   string
		token  func(t *testing.T) string
		pod    *PodInfo // the index's cart-7d9f; nil: none
		wantOK bool
	}{
		{name: "a live Pod's bound token", pod: live, wantOK: true},
		{name: "aud as one string", pod: live, wantOK: true,
			token: func(t *testing.T) string { return boundToken(t, func(c map[string]any) { c["aud"] = "istio-ca" }) }},
		{name: "a Pod being deleted still drains", pod: &PodInfo{Namespace: "shop", Name: "cart-7d9f", UID: "pod-uid-1", ServiceAccount: "cart", Deleting: true},
			wantOK: true},
		{name: "not in the index", pod: nil},
		{name: "another UID: the Pod was replaced", pod: &PodInfo{Namespace: "shop", Name: "cart-7d9f", UID: "pod-uid-2", ServiceAccount: "cart"}},
		{name: "another service account", pod: &PodInfo{Namespace: "shop", Name: "cart-7d9f", UID: "pod-uid-1", ServiceAccount: "web"}},
		{name: "terminated", pod: &PodInfo{Namespace: "shop", Name: "cart-7d9f", UID: "pod-uid-1", ServiceAccount: "cart", Terminated: true}},
		{name: "another audience", pod: live,
			token: func(t *testing.T) string { return boundToken(t, func(c map[string]any) { c["aud"] = []string{"api"} }) }},
		{name: "no audience", pod: live,
			token: func(t *testing.T) string { return boundToken(t, func(c map[string]any) { delete(c, "aud") }) }},
		{name: "expired", pod: live,
			token: func(t *testing.T) string {
				return boundToken(t, func(c map[string]any) { c["exp"] = time.Unix(1e9-1, 0).Unix() })
			}},
		{name: "no expiry (legacy)", pod: live,
			token: func(t *testing.T) string { return boundToken(t, func(c map[string]any) { delete(c, "exp") }) }},
		{name: "not bound to a Pod", pod: live,
			token: func(t *testing.T) string { return boundToken(t, func(c map[string]any) { delete(k8s(c), "pod") }) }},
		{name: "a Pod claim without its UID", pod: live, token: func(t *testing.T) string {
			return boundToken(t, func(c map[string]any) { k8s(c)["pod"] = map[string]any{"name": "cart-7d9f"} })
		}},
		{name: "a Pod claim of another shape", pod: live,
			token: func(t *testing.T) string {
				return boundToken(t, func(c map[string]any) { k8s(c)["pod"] = "cart-7d9f" })
			}},
		{name: "not a JWT", pod: live, token: func(*testing.T) string { return "who-knows" }},
		{name: "a JWT whose payload is not JSON", pod: live, token: func(*testing.T) string { return "eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.c2ln" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			idx := indexFake{}
			if tt.pod != nil {
				idx["shop/cart-7d9f"] = tt.pod
			}
			p := &Plausibility{Cluster: "Kubernetes", Pods: idx, Now: func() time.Time { return time.Unix(1e9, 0) }}
			token := boundToken(t, nil)
			if tt.token != nil {
				token = tt.token(t)
			}
			subject, ok := p.Plausible(context.Background(), token)
			switch {
			case ok != tt.wantOK:
				t.Fatalf("plausible: %v, want %v", ok, tt.wantOK)
			case ok && subject != "Kubernetes/pod-uid-1":
				t.Fatalf("subject %q, want Kubernetes/pod-uid-1", subject)
			case !ok && subject != "":
				t.Fatalf("subject %q of a token not plausible", subject)
			}
		})
	}
}
