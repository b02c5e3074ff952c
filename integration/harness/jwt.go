package harness

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/meshca/meshca/internal/pemutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SignedToken signs a service-account token for ns/sa with the apiserver's
// own signing key, valid from notBefore to expiry. It lets a test hold a
// token the TokenRequest API would never issue, such as an expired one.
func (c *Cluster) SignedToken(tb testing.TB, ns, sa string, audiences []string, notBefore, expiry time.Time) string {
	tb.Helper()
	keyPEM, err := os.ReadFile(c.SAKeyFile)
	if err != nil {
		tb.Fatal(err)
	}
	key, err := pemutil.ParsePrivateKey(keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	acct, err := c.Client.CoreV1().ServiceAccounts(ns).Get(context.Background(), sa, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	header := map[string]string{"alg": "RS256", "typ": "JWT"}
	claims := map[string]any{
		"iss": c.Issuer,
		"sub": "system:serviceaccount:" + ns + ":" + sa,
		"aud": audiences,
		"iat": notBefore.Unix(),
		"nbf": notBefore.Unix(),
		"exp": expiry.Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      ns,
			"serviceaccount": map[string]string{"name": sa, "uid": string(acct.UID)},
		},
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signing := enc(header) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signing))
	sig, err := key.(*rsa.PrivateKey).Sign(rand.Reader, sum[:], crypto.SHA256)
	if err != nil {
		tb.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}
