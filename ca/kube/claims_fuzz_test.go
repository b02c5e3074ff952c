package kube

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authnv1 "k8s.io/api/authentication/v1"
)

// fuzzJWT is a token with the given claims JSON and a fake signature.
func fuzzJWT(claims string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"RS256","kid":"k"}`)) + "." +
		base64.RawURLEncoding.EncodeToString([]byte(claims)) + ".c2lnbmF0dXJl"
}

// FuzzReadClaims: the claims of any bearer token a client sends are read
// without verification (to bound the TokenReview cache entry, and by
// `meshca explain`), so they must never panic. A token jwtShaped lets
// through to a TokenReview is split as a JWT; tokenExpiry agrees with
// ReadClaims; and accepted claims, written into a token again, read back
// the same.
func FuzzReadClaims(f *testing.F) {
	// A projected service-account token as the kubelet mounts it for ztunnel.
	f.Add(fuzzJWT(`{"aud":["istio-ca"],"exp":1900000000,"iat":1899996400,"iss":"https://kubernetes.default.svc.cluster.local",` +
		`"jti":"6c1d1b9a","kubernetes.io":{"namespace":"istio-system","node":{"name":"node-a","uid":"3b1c"},` +
		`"pod":{"name":"ztunnel-x7k2p","uid":"8f0e"},"serviceaccount":{"name":"ztunnel","uid":"a1b2"}},` +
		`"nbf":1899996400,"sub":"system:serviceaccount:istio-system:ztunnel"}`))
	f.Add(fuzzJWT(`{"exp":-1,"kubernetes.io":{"namespace":"","serviceaccount":{}}}`))
	f.Add(fuzzJWT(`{"exp":1.5e9}`))
	f.Add(fuzzJWT(`{"kubernetes.io":{"namespace":"a\u0000b","serviceaccount":{"name":"\ud800"}}}`))
	f.Add(fuzzJWT(`[]`))
	f.Add("a.eyJleHAiOjE3MDAwMDAwMDB9.c")
	f.Add("a.!!!.c")
	f.Add("...")
	f.Add("")
	f.Fuzz(func(t *testing.T, token string) {
		c, err := ReadClaims(token)
		exp := tokenExpiry(token)
		if err != nil {
			if c != nil {
				t.Fatalf("ReadClaims returned claims along with %v", err)
			}
			if !exp.IsZero() {
				t.Fatalf("tokenExpiry = %v for a token ReadClaims refuses", exp)
			}
			if jwtShaped(token) && strings.Contains(err.Error(), "not a JWT") {
				t.Fatalf("jwtShaped accepts %q, ReadClaims says it is not a JWT", token)
			}
			return
		}
		if strings.Count(token, ".") != 2 {
			t.Fatalf("ReadClaims accepted %q, which is not three segments", token)
		}
		if !exp.Equal(c.Exp) {
			t.Fatalf("tokenExpiry = %v, ReadClaims says %v", exp, c.Exp)
		}
		if !c.Exp.IsZero() && c.Exp.Unix() <= 0 {
			t.Fatalf("ReadClaims returned expiry %v, not after the epoch", c.Exp)
		}
		claims := map[string]any{"kubernetes.io": map[string]any{
			"namespace": c.Namespace, "serviceaccount": map[string]any{"name": c.ServiceAccount},
		}}
		if !c.Exp.IsZero() {
			claims["exp"] = c.Exp.Unix()
		}
		payload, err := json.Marshal(claims)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ReadClaims(fuzzJWT(string(payload)))
		if err != nil {
			t.Fatalf("claims %s, written again, do not read: %v", payload, err)
		}
		if !again.Exp.Equal(c.Exp) || again.Namespace != c.Namespace || again.ServiceAccount != c.ServiceAccount {
			t.Fatalf("claims %+v, written again, read as %+v", c, again)
		}
	})
}

// FuzzIdentityFromReview: whatever a TokenReview answers (the user name,
// group, audience, error and bound-object extras come from the token and
// the apiserver), identityFromReview never panics. A refusal is an
// Unauthenticated *Error (not a retry) that says only the safe message;
// an identity is granted only to an authenticated service account with
// our audience, and is exactly spiffe://<td>/ns/<ns>/sa/<sa> of the user
// name system:serviceaccount:<ns>:<sa>, with the extras as sent.
func FuzzIdentityFromReview(f *testing.F) {
	f.Add("system:serviceaccount:istio-system:ztunnel", saGroup, DefaultAudience, "", true, "ztunnel-x7k2p", "8f0e-11", "node-a")
	f.Add("system:serviceaccount:prod:frontend", saGroup, DefaultAudience, "", true, "", "", "")
	f.Add("system:serviceaccount:prod:a:b", saGroup, DefaultAudience, "", true, "", "", "")
	f.Add("system:serviceaccount:..:x", saGroup, DefaultAudience, "", true, "", "", "")
	f.Add("system:serviceaccount:prod:front%2fend", saGroup, DefaultAudience, "", true, "", "", "")
	f.Add("system:serviceaccount:prod:frontend", "system:authenticated", DefaultAudience, "", true, "", "", "")
	f.Add("system:serviceaccount:prod:frontend", saGroup, "api", "", true, "", "", "")
	f.Add("system:serviceaccount:prod:frontend", saGroup, DefaultAudience, "service account token has expired", false, "", "", "")
	f.Add("alice", saGroup, DefaultAudience, "", true, "", "", "")
	td := spiffeid.RequireTrustDomainFromString("cluster.local")
	f.Fuzz(func(t *testing.T, username, group, audience, reviewErr string, authenticated bool, podName, podUID, node string) {
		st := &authnv1.TokenReviewStatus{
			Authenticated: authenticated,
			Error:         reviewErr,
			Audiences:     []string{audience},
			User: authnv1.UserInfo{
				Username: username,
				Groups:   []string{group, "system:authenticated"},
				Extra:    map[string]authnv1.ExtraValue{},
			},
		}
		for k, v := range map[string]string{extraPodName: podName, extraPodUID: podUID, extraNode: node} {
			if v != "" {
				st.User.Extra[k] = authnv1.ExtraValue{v}
			}
		}
		id, err := identityFromReview(td, []string{DefaultAudience}, st)
		if err != nil {
			var ke *Error
			if !errors.As(err, &ke) || ke.Retry || ke.Reason == "" || ke.Msg != tokenMsg {
				t.Fatalf("refusal %#v is not an Unauthenticated *Error with the safe message", err)
			}
			if id != nil {
				t.Fatal("identityFromReview returned an identity along with a refusal")
			}
			return
		}
		switch {
		case reviewErr != "" || !authenticated:
			t.Fatalf("granted %v to a token the review refused (%q, authenticated %v)", id.ID, reviewErr, authenticated)
		case audience != DefaultAudience:
			t.Fatalf("granted %v to a token for audience %q", id.ID, audience)
		case group != saGroup:
			t.Fatalf("granted %v to a user of group %q", id.ID, group)
		case username != saUsername+id.Namespace+":"+id.ServiceAccount:
			t.Fatalf("granted %s/%s to user %q", id.Namespace, id.ServiceAccount, username)
		case id.PodName != podName || id.PodUID != podUID || id.Node != node:
			t.Fatalf("extras %q %q %q read as %q %q %q", podName, podUID, node, id.PodName, id.PodUID, id.Node)
		}
		want, err := spiffeid.FromSegments(td, "ns", id.Namespace, "sa", id.ServiceAccount)
		if err != nil || id.ID != want {
			t.Fatalf("granted %v for %s/%s, want %v (%v)", id.ID, id.Namespace, id.ServiceAccount, want, err)
		}
		if again, err := spiffeid.FromString(id.ID.String()); err != nil || again != id.ID {
			t.Fatalf("granted ID %v does not parse back (%v)", id.ID, err)
		}
	})
}
