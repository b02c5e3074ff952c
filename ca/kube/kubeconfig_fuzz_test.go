package kube

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// fuzzKubeconfig is a kubeconfig as istioctl create-remote-secret writes
// it, for cluster id, with the extra lines given for its cluster and its
// user (indented by four spaces).
func fuzzKubeconfig(id, clusterLines, userLines string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJkekNDQVIyZ0F3SUJBZ0lCQURBS0JnZ3Foa2pPUFFRREFqQWpNU0V3SHdZRFZRUUREQmhyTTNNdApjMlZ5ZG1WeUxXTmhRREUzTURBd01EQXdNREF3Q2c9PQotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==
    server: https://%[1]s.example:6443
%[2]s
  name: %[1]s
contexts:
- context:
    cluster: %[1]s
    user: %[1]s
  name: %[1]s
current-context: %[1]s
preferences: {}
users:
- name: %[1]s
  user:
    token: eyJhbGciOiJSUzI1NiIsImtpZCI6Im1lc2hjYS1mdXp6In0.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6aXN0aW8tc3lzdGVtOmlzdGlvLXJlYWRlciJ9.c2lnbmF0dXJlLXMzY3JldA
%[3]s
`, id, clusterLines, userLines)
}

// fuzzKubeconfigSeeds are kubeconfigs a remote-cluster Secret holds: a
// plain one, one per refused feature, and near misses.
func fuzzKubeconfigSeeds() [][]byte {
	return [][]byte{
		fuzzKubeconfig("west", "", ""),
		fuzzKubeconfig("west", "    insecure-skip-tls-verify: true\n    tls-server-name: kubernetes.default.svc\n    proxy-url: socks5://proxy.example:1080", ""),
		fuzzKubeconfig("west", "", "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: /bin/sh\n      args: [-c, id]\n      interactiveMode: Never"),
		fuzzKubeconfig("west", "", "    auth-provider:\n      name: gcp\n      config: {cmd-path: /bin/sh}"),
		fuzzKubeconfig("west", "", "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"),
		fuzzKubeconfig("west", "", "    client-certificate: /etc/cert.pem\n    client-key-data: eA=="),
		fuzzKubeconfig("west", "", "    client-certificate-data: eA==\n    client-key: /etc/key.pem"),
		fuzzKubeconfig("west", "    certificate-authority: /etc/passwd", ""),
		fuzzKubeconfig("west", "    proxy-url: \"http://u:p@%zz\"", ""),
		fuzzKubeconfig("west", "    extensions:\n    - name: client.authentication.k8s.io/exec\n      extension: {a: b}", "    as: system:admin\n    as-groups: [system:masters]"),
		[]byte("apiVersion: v1\nkind: Config\ncurrent-context: missing\n"),
		[]byte(`{"apiVersion":"v1","kind":"Config","clusters":[{"name":"c","cluster":{"server":"https://c"}}],"users":[{"name":"u","user":{"exec":{"command":"x"}}}],"contexts":[{"name":"c","context":{"cluster":"c","user":"u"}}],"current-context":"c"}`),
		{},
		fuzzKubeconfig("west", "    proxy-url: ftp://proxyuser:S3cretProxyPass@proxy.example:21", ""),
		bytes.Replace(fuzzKubeconfig("west", "", ""), []byte("https://west"), []byte("http://west"), 1),
		bytes.Replace(fuzzKubeconfig("west", "", ""), []byte("https://west"), []byte("west"), 1),
	}
}

// fuzzAllow is the set of features bits allows. Only the features that
// make client-go neither read nor open a file while it builds the
// configuration are ever allowed here, so that an input cannot make a
// fuzz run read /dev/zero or block on a FIFO.
func fuzzAllow(bits uint8) KubeconfigAllow {
	allow := KubeconfigAllow{}
	for i, f := range []KubeconfigFeature{KubeconfigExec, KubeconfigAuthProvider, KubeconfigInsecureSkipTLSVerify, KubeconfigHTTP} {
		if bits&(1<<i) != 0 {
			allow[f] = true
		}
	}
	return allow
}

// usesRefused returns a feature rc uses that allow does not name.
func usesRefused(rc *rest.Config, allow KubeconfigAllow) (KubeconfigFeature, bool) {
	switch {
	case rc.ExecProvider != nil && !allow[KubeconfigExec]:
		return KubeconfigExec, true
	case rc.AuthProvider != nil && !allow[KubeconfigAuthProvider]:
		return KubeconfigAuthProvider, true
	case rc.BearerTokenFile != "" && !allow[KubeconfigTokenFile]:
		return KubeconfigTokenFile, true
	case rc.CertFile != "" && !allow[KubeconfigClientCertificate]:
		return KubeconfigClientCertificate, true
	case rc.KeyFile != "" && !allow[KubeconfigClientKey]:
		return KubeconfigClientKey, true
	case rc.CAFile != "" && !allow[KubeconfigCertificateAuthority]:
		return KubeconfigCertificateAuthority, true
	case rc.Insecure && !allow[KubeconfigInsecureSkipTLSVerify]:
		return KubeconfigInsecureSkipTLSVerify, true
	case !rest.IsConfigTransportTLS(*rc) && !allow[KubeconfigHTTP]:
		return KubeconfigHTTP, true
	}
	return "", false
}

// FuzzSanitizeKubeconfig feeds SanitizeKubeconfig what whoever may write
// Secrets in the remote-secret namespace can put there, with any allowed
// set of the features that need no file. It never panics. A refusal is a
// *KubeconfigError, names a feature only when it is not allowed, and never
// quotes a token, password (a user's, or one in a server or proxy URL) or
// client key of the file. A configuration it
// returns has a server, and uses no feature that is not allowed (TLS
// included, unless http is allowed), and the file it came from has no
// user or cluster using one either, whether the current context uses it
// or not.
func FuzzSanitizeKubeconfig(f *testing.F) {
	for _, s := range fuzzKubeconfigSeeds() {
		f.Add(s, uint8(0))
	}
	f.Add(fuzzKubeconfigSeeds()[2], uint8(1))
	f.Add(fuzzKubeconfigSeeds()[3], uint8(2))
	f.Add(fuzzKubeconfigSeeds()[14], uint8(8))
	f.Fuzz(func(t *testing.T, raw []byte, bits uint8) {
		allow := fuzzAllow(bits)
		rc, err := SanitizeKubeconfig(raw, allow)
		in, loadErr := clientcmd.Load(raw)
		if err != nil {
			var ke *KubeconfigError
			switch {
			case !errors.As(err, &ke):
				t.Fatalf("refusal %v (%T) is not a *KubeconfigError", err, err)
			case ke.Feature != "" && allow[ke.Feature]:
				t.Fatalf("refused the allowed feature %s: %v", ke.Feature, err)
			case rc != nil:
				t.Fatal("SanitizeKubeconfig returned a configuration along with a refusal")
			}
			if loadErr == nil {
				var secrets []string
				for _, a := range in.AuthInfos {
					secrets = append(secrets, a.Token, a.Password, string(a.ClientKeyData))
				}
				for _, c := range in.Clusters {
					for _, raw := range []string{c.Server, c.ProxyURL} {
						if u, err := url.Parse(raw); err == nil && u.User != nil {
							password, _ := u.User.Password()
							secrets = append(secrets, password)
						}
					}
				}
				for _, s := range secrets {
					if len(s) >= 12 && bytes.Count(raw, []byte(s)) == 1 && strings.Contains(err.Error(), s) {
						t.Fatalf("refusal %q quotes a credential of the kubeconfig", err)
					}
				}
			}
			return
		}
		if loadErr != nil {
			t.Fatalf("SanitizeKubeconfig accepted a kubeconfig client-go does not load: %v", loadErr)
		}
		if rc.Host == "" {
			t.Fatal("SanitizeKubeconfig returned a configuration without a server")
		}
		if feature, ok := usesRefused(rc, allow); ok {
			t.Fatalf("the configuration uses %s, which is not allowed", feature)
		}
		for name, a := range in.AuthInfos {
			if a.Exec != nil && !allow[KubeconfigExec] || a.AuthProvider != nil && !allow[KubeconfigAuthProvider] ||
				a.TokenFile != "" || a.ClientCertificate != "" || a.ClientKey != "" {
				t.Fatalf("accepted a kubeconfig whose user %q uses a feature that is not allowed", name)
			}
		}
		for name, c := range in.Clusters {
			if c.CertificateAuthority != "" {
				t.Fatalf("accepted a kubeconfig whose cluster %q reads a CA file", name)
			}
			if u, err := url.Parse(c.Server); c.Server != "" && (err != nil || u.Scheme != "https" && (u.Scheme != "http" || !allow[KubeconfigHTTP])) {
				t.Fatalf("accepted a kubeconfig whose cluster %q has a server that is not https", name)
			}
		}
	})
}

// fuzzClusters is a Clusters that holds the local cluster and records
// what RemoteSecrets puts, checking every configuration it is given.
type fuzzClusters struct {
	t     *testing.T
	fixed map[string]bool
	held  map[string]*rest.Config
}

func (c *fuzzClusters) Has(id string) bool {
	_, ok := c.held[id]
	return ok || c.fixed[id]
}

func (c *fuzzClusters) Put(_ context.Context, id string, cfg *rest.Config, replace bool) error {
	if feature, ok := usesRefused(cfg, nil); ok {
		c.t.Fatalf("cluster %q put with a configuration that uses %s", id, feature)
	}
	if _, ok := c.held[id]; c.fixed[id] || ok && !replace {
		return fmt.Errorf("cluster %s: %w", id, ErrClusterExists)
	}
	c.held[id] = cfg
	return nil
}

func (c *fuzzClusters) Remove(id string) {
	if c.fixed[id] {
		c.t.Fatalf("the local cluster %q was removed", id)
	}
	delete(c.held, id)
}

// FuzzRemoteSecrets feeds the remote-cluster Secret watcher two Secrets
// holding any two cluster ids and kubeconfigs, changed and then deleted,
// with no kubeconfig feature allowed. It never panics, and after every
// event: the clusters held are exactly those it owns, each from a Secret
// that still holds its id with the kubeconfig it was built from; the
// local cluster is never replaced or removed; every id some Secret offers
// with an acceptable kubeconfig is held by one Secret; and once both
// Secrets are gone, no remote cluster is left.
func FuzzRemoteSecrets(f *testing.F) {
	seeds := fuzzKubeconfigSeeds()
	f.Add("west", seeds[0], "east", seeds[1])
	f.Add("west", seeds[0], "west", seeds[2])
	f.Add("Kubernetes", seeds[0], "east", seeds[0])
	f.Add("west", seeds[4], "east", seeds[10])
	f.Add("west", seeds[14], "west", seeds[0])
	f.Fuzz(func(t *testing.T, id1 string, kc1 []byte, id2 string, kc2 []byte) {
		clusters := &fuzzClusters{t: t, fixed: map[string]bool{"Kubernetes": true}, held: map[string]*rest.Config{}}
		r := NewRemoteSecrets(RemoteSecretsConfig{Namespace: "istio-system", Clusters: clusters,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		ctx := context.Background()
		steps := []struct {
			secret string
			data   map[string][]byte
		}{
			{"a", map[string][]byte{id1: kc1, id2: kc2}},
			{"b", map[string][]byte{id1: kc2, id2: kc1}},
			{"a", map[string][]byte{id2: kc1}},
			{"a", nil},
			{"b", map[string][]byte{id1: kc1}},
			{"b", nil},
		}
		acceptable := map[[32]byte]bool{}
		for _, kc := range [][]byte{kc1, kc2} {
			_, err := SanitizeKubeconfig(kc, nil)
			acceptable[sha256.Sum256(kc)] = err == nil
		}
		for i, step := range steps {
			r.apply(ctx, step.secret, step.data)
			requireRemoteSecretsConsistent(t, r, clusters, acceptable, fmt.Sprintf("step %d (Secret %s)", i+1, step.secret))
		}
		if len(r.owners) != 0 || len(clusters.held) != 0 {
			t.Fatalf("both Secrets are gone, and clusters %v remain", kubeconfigNames(clusters.held))
		}
	})
}

// requireRemoteSecretsConsistent checks the invariants of
// FuzzRemoteSecrets; acceptable says, by hash, which kubeconfigs
// SanitizeKubeconfig accepts.
func requireRemoteSecretsConsistent(t *testing.T, r *RemoteSecrets, c *fuzzClusters, acceptable map[[32]byte]bool, when string) {
	t.Helper()
	if len(c.held) != len(r.owners) {
		t.Fatalf("%s: clusters %v held, owners %v", when, kubeconfigNames(c.held), kubeconfigNames(r.owners))
	}
	for id, o := range r.owners {
		if _, ok := c.held[id]; !ok {
			t.Fatalf("%s: cluster %q is owned by Secret %s but not held", when, id, o.secret)
		}
		kc, ok := r.secrets[o.secret][id]
		switch {
		case !ok:
			t.Fatalf("%s: cluster %q is owned by Secret %s, which no longer holds it", when, id, o.secret)
		case sha256.Sum256(kc) != o.sum:
			t.Fatalf("%s: cluster %q runs another kubeconfig than Secret %s holds", when, id, o.secret)
		}
	}
	for _, secret := range kubeconfigNames(r.secrets) {
		for _, id := range kubeconfigNames(r.secrets[secret]) {
			if _, owned := r.owners[id]; owned || c.fixed[id] {
				continue
			}
			if acceptable[sha256.Sum256(r.secrets[secret][id])] {
				t.Fatalf("%s: Secret %s offers cluster %q with an acceptable kubeconfig, and nobody holds it", when, secret, id)
			}
		}
	}
}
