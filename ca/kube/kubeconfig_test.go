package kube_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshca/meshca/ca/kube"
	"k8s.io/client-go/rest"
)

// kcSecretToken is in every test kubeconfig; no error or log may show it.
const kcSecretToken = "s3cret-token-value"

// testKubeconfig returns a kubeconfig for server whose one cluster and
// one user have the extra YAML lines given (indented by four spaces).
func testKubeconfig(server, clusterLines, userLines string) []byte {
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: east
  cluster:
    server: %s
%s
users:
- name: reader
  user:
%s
contexts:
- name: east
  context: {cluster: east, user: reader}
current-context: east
`, server, clusterLines, userLines)
}

// kcFeatureCase is one dangerous kubeconfig feature: the server and lines
// that use it, and how to see it in the built configuration.
type kcFeatureCase struct {
	feature      kube.KubeconfigFeature
	reason       string
	server       string // empty: https://east.example:6443
	cluster      string
	user         string
	inRESTConfig func(*rest.Config) bool
}

func kcFeatureCases(t *testing.T) []kcFeatureCase {
	dir := t.TempDir()
	file := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("local file"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := "    token: " + kcSecretToken
	return []kcFeatureCase{
		{feature: kube.KubeconfigExec, reason: "exec",
			user:         "    exec:\n      apiVersion: client.authentication.k8s.io/v1beta1\n      command: /bin/sh\n      args: [-c, id]",
			inRESTConfig: func(c *rest.Config) bool { return c.ExecProvider != nil && c.ExecProvider.Command == "/bin/sh" }},
		{feature: kube.KubeconfigAuthProvider, reason: "auth_provider",
			user:         "    auth-provider:\n      name: gcp\n      config: {cmd-path: /bin/sh}",
			inRESTConfig: func(c *rest.Config) bool { return c.AuthProvider != nil && c.AuthProvider.Name == "gcp" }},
		{feature: kube.KubeconfigTokenFile, reason: "token_file",
			user:         "    tokenFile: " + file("token"),
			inRESTConfig: func(c *rest.Config) bool { return c.BearerTokenFile != "" && c.BearerToken == "local file" }},
		{feature: kube.KubeconfigClientCertificate, reason: "client_certificate",
			user:         "    client-certificate: " + file("tls.crt") + "\n    client-key-data: eA==",
			inRESTConfig: func(c *rest.Config) bool { return c.CertFile != "" }},
		{feature: kube.KubeconfigClientKey, reason: "client_key",
			user:         "    client-certificate-data: eA==\n    client-key: " + file("tls.key"),
			inRESTConfig: func(c *rest.Config) bool { return c.KeyFile != "" }},
		{feature: kube.KubeconfigCertificateAuthority, reason: "certificate_authority",
			cluster: "    certificate-authority: " + file("kube.crt"), user: token,
			inRESTConfig: func(c *rest.Config) bool { return c.CAFile != "" }},
		{feature: kube.KubeconfigInsecureSkipTLSVerify, reason: "insecure_skip_tls_verify",
			cluster: "    insecure-skip-tls-verify: true", user: token,
			inRESTConfig: func(c *rest.Config) bool { return c.Insecure }},
		{feature: kube.KubeconfigHTTP, reason: "http", server: "http://east.example:8080", user: token,
			inRESTConfig: func(c *rest.Config) bool { return !rest.IsConfigTransportTLS(*c) }},
	}
}

// serverURL is the case's server.
func (tc kcFeatureCase) serverURL() string {
	if tc.server == "" {
		return "https://east.example:6443"
	}
	return tc.server
}

// raw is the case's kubeconfig.
func (tc kcFeatureCase) raw() []byte {
	return testKubeconfig(tc.serverURL(), tc.cluster, tc.user)
}

func TestSanitizeKubeconfigFeatures(t *testing.T) {
	for _, tc := range kcFeatureCases(t) {
		t.Run(string(tc.feature), func(t *testing.T) {
			raw := tc.raw()

			_, err := kube.SanitizeKubeconfig(raw, nil)
			var ke *kube.KubeconfigError
			switch {
			case !errors.As(err, &ke):
				t.Fatalf("refused by default: got %v, want a *KubeconfigError", err)
			case ke.Feature != tc.feature || ke.Reason() != tc.reason:
				t.Errorf("feature %q reason %q, want %q %q", ke.Feature, ke.Reason(), tc.feature, tc.reason)
			case !strings.Contains(err.Error(), "--"+kube.KubeconfigAllowFlag+" includes "+string(tc.feature)):
				t.Errorf("error does not say which flag value allows it: %v", err)
			case !strings.Contains(err.Error(), `"reader"`) && !strings.Contains(err.Error(), `"east"`):
				t.Errorf("error does not name the entry: %v", err)
			case strings.Contains(err.Error(), kcSecretToken):
				t.Errorf("error shows the token: %v", err)
			}

			others := kube.KubeconfigAllow{}
			for _, f := range kube.KubeconfigFeatures {
				others[f] = f != tc.feature
			}
			if _, err := kube.SanitizeKubeconfig(raw, others); !errors.As(err, &ke) || ke.Feature != tc.feature {
				t.Errorf("allowing every other feature: got %v, want %s refused", err, tc.feature)
			}

			cfg, err := kube.SanitizeKubeconfig(raw, kube.KubeconfigAllow{tc.feature: true})
			if err != nil {
				t.Fatalf("allowed: %v", err)
			}
			if cfg.Host != tc.serverURL() || !tc.inRESTConfig(cfg) {
				t.Errorf("allowed: configuration lacks %s: %+v", tc.feature, cfg)
			}
		})
	}
}

func TestSanitizeKubeconfigJudgesEveryEntry(t *testing.T) {
	token := "    token: " + kcSecretToken
	unusedUser := "\n- name: unused\n  user:\n    exec: {apiVersion: client.authentication.k8s.io/v1beta1, command: /bin/sh}"
	unusedCluster := "\n- name: unused\n  cluster: {server: https://x.example, certificate-authority: /etc/passwd}"
	tests := []struct {
		name  string
		raw   []byte
		allow kube.KubeconfigAllow
		want  kube.KubeconfigFeature
	}{
		{name: "unused user", raw: testKubeconfig("https://east.example", "", token+unusedUser), want: kube.KubeconfigExec},
		{name: "unused cluster", raw: testKubeconfig("https://east.example", "    tls-server-name: kubernetes.default.svc"+unusedCluster, token),
			want: kube.KubeconfigCertificateAuthority},
		// Over plain HTTP client-go ignores the user; the file is still refused.
		{name: "user ignored over http", raw: testKubeconfig("http://east.example", "", "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"),
			allow: kube.KubeconfigAllow{kube.KubeconfigHTTP: true}, want: kube.KubeconfigTokenFile},
		{name: "unused cluster over http", raw: testKubeconfig("https://east.example", "\n- name: unused\n  cluster: {server: \"HTTP://x.example\"}", token),
			want: kube.KubeconfigHTTP},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := kube.SanitizeKubeconfig(tt.raw, tt.allow)
			var ke *kube.KubeconfigError
			if !errors.As(err, &ke) || ke.Feature != tt.want {
				t.Fatalf("got %v, want %s refused", err, tt.want)
			}
		})
	}
}

func TestSanitizeKubeconfigPlain(t *testing.T) {
	raw := testKubeconfig("https://east.example:6443", "    certificate-authority-data: eA==\n    extensions:\n    - name: client.authentication.k8s.io/exec\n      extension: {a: b}",
		"    token: "+kcSecretToken)
	cfg, err := kube.SanitizeKubeconfig(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://east.example:6443" || cfg.BearerToken != kcSecretToken || string(cfg.CAData) != "x" {
		t.Errorf("configuration %+v", cfg)
	}
	if cfg.ExecProvider != nil || cfg.AuthProvider != nil || cfg.BearerTokenFile != "" || cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "" {
		t.Errorf("configuration uses a local feature: %+v", cfg)
	}
}

func TestSanitizeKubeconfigInvalid(t *testing.T) {
	tests := []struct {
		name string
		raw  []byte
		want string
	}{
		{name: "not YAML", raw: []byte("users: [token: " + kcSecretToken + " {{"), want: "does not parse"},
		{name: "wrong type", raw: []byte("users: " + kcSecretToken), want: "does not parse"},
		{name: "empty", raw: nil, want: "unusable"},
		{name: "no such context", raw: []byte(strings.Replace(string(testKubeconfig("https://e", "", "    token: "+kcSecretToken)), "current-context: east", "current-context: west", 1)),
			want: "unusable"},
		// client-go would pick http for these unless the cluster has a CA
		// or the user a client certificate.
		{name: "server without a scheme", raw: testKubeconfig("east.example:6443", "", "    token: "+kcSecretToken), want: "server must be an https:// URL"},
		{name: "server of an IP without a scheme", raw: testKubeconfig("10.0.0.1:6443", "", "    token: "+kcSecretToken), want: "server must be an https:// URL"},
		{name: "server of another scheme", raw: testKubeconfig("ws://u:"+kcSecretToken+"@east.example", "", "    token: x"), want: "server must be an https:// URL"},
		{name: "bad proxy", raw: testKubeconfig("https://e", "    proxy-url: \"http://u:"+kcSecretToken+"@%zz\"", "    token: x"), want: "proxy-url does not parse"},
		{name: "proxy of a scheme client-go refuses", raw: testKubeconfig("https://e", "    proxy-url: ftp://u:"+kcSecretToken+"@proxy.example:21", "    token: x"),
			want: "proxy-url must be an http, https or socks5 URL"},
		{name: "proxy without a scheme", raw: testKubeconfig("https://e", "    proxy-url: \"u:"+kcSecretToken+"@proxy.example\"", "    token: x"),
			want: "proxy-url must be an http, https or socks5 URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := kube.SanitizeKubeconfig(tt.raw, nil)
			var ke *kube.KubeconfigError
			switch {
			case !errors.As(err, &ke):
				t.Fatalf("got %v, want a *KubeconfigError", err)
			case ke.Reason() != "invalid_kubeconfig" || !strings.Contains(err.Error(), tt.want):
				t.Errorf("got %v (reason %s), want invalid_kubeconfig %q", err, ke.Reason(), tt.want)
			case strings.Contains(err.Error(), kcSecretToken):
				t.Errorf("error shows the token: %v", err)
			}
		})
	}
}

func TestParseKubeconfigAllow(t *testing.T) {
	allow, err := kube.ParseKubeconfigAllow([]string{"exec", " tokenFile", "certificate-authority"})
	if err != nil {
		t.Fatal(err)
	}
	want := kube.KubeconfigAllow{kube.KubeconfigExec: true, kube.KubeconfigTokenFile: true, kube.KubeconfigCertificateAuthority: true}
	if fmt.Sprint(allow) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", allow, want)
	}
	if _, err := kube.ParseKubeconfigAllow([]string{"exec", "token-file"}); err == nil || !strings.Contains(err.Error(), `"token-file"`) {
		t.Errorf("unknown value: got %v", err)
	}
}
