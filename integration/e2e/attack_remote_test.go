package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	authpb "github.com/meshca/meshca/proto/istio/v1/auth"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// remoteSecretSurface: the Secrets labelled istio/multiCluster=true in the
// namespace the arena's meshca watches (--remote-secret-namespace), one
// kubeconfig per remote cluster id. Whoever may write Secrets there
// writes them; each kubeconfig below would make meshca run a command,
// read a file of its own, talk to an apiserver it cannot authenticate,
// or take a cluster id it does not own. Each must be refused with its
// reason: a "remote cluster refused" log line naming the cluster and the
// reason, meshca_remote_cluster_refused_total{reason} counting it, and
// the cluster id never served (a request naming it is unknown_cluster).
type remoteSecretSurface struct {
	ns    string
	flags []string
	rows  []remoteRow
	// before is meshca_remote_cluster_refused_total by reason before the
	// Secrets were written; want is how many refusals of each the rows
	// make.
	before, want map[string]float64
}

type remoteRow struct {
	name, id, reason, defence string
	// frag is a fragment of the refusal's error in the log line.
	frag       string
	kubeconfig []byte
	// secret is the Secret's name; "" names it after the row's index.
	secret string
	// served: the id is held by another cluster, which must keep it.
	served bool
}

const twinID = "attack-twin"

func newRemoteSecretSurface(t *testing.T) *remoteSecretSurface {
	ns := cluster.Namespace(t, "attack-remote")
	return &remoteSecretSurface{ns: ns, flags: []string{"--remote-secret-namespace", ns}}
}

// prepare writes the Secrets once meshca watches them; a second Secret
// takes twinID, held by a first one with a working kubeconfig.
func (s *remoteSecretSurface) prepare(t *testing.T, a *arena) {
	good, err := os.ReadFile(cluster.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	a.secret(cluster.AdminToken) // the kubeconfigs carry it: it must not reach the log
	edit := func(f func(c *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo)) []byte {
		cfg, err := clientcmd.Load(good)
		if err != nil {
			t.Fatal(err)
		}
		f(cfg.Clusters["local"], cfg.AuthInfos["admin"])
		out, err := clientcmd.Write(*cfg)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	row := func(id, reason, frag string, f func(c *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo)) remoteRow {
		return remoteRow{name: "remote secret/" + id, id: id, reason: reason, frag: frag, kubeconfig: edit(f),
			defence: "remote_secret:" + strings.ReplaceAll(id, "-", "_")}
	}
	s.rows = []remoteRow{
		row("exec", "exec", "uses exec", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.Exec = &clientcmdapi.ExecConfig{APIVersion: "client.authentication.k8s.io/v1", Command: "/bin/sh",
				Args: []string{"-c", "cat /etc/shadow"}, InteractiveMode: clientcmdapi.NeverExecInteractiveMode}
		}),
		row("auth-provider", "auth_provider", "uses auth-provider", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.AuthProvider = &clientcmdapi.AuthProviderConfig{Name: "oidc", Config: map[string]string{"idp-issuer-url": "https://evil.example"}}
		}),
		row("token-file", "token_file", "uses tokenFile", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.TokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
		}),
		row("client-certificate", "client_certificate", "uses client-certificate", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.ClientCertificate, u.ClientCertificateData = "/etc/meshca/tls.crt", nil
		}),
		row("client-key", "client_key", "uses client-key", func(_ *clientcmdapi.Cluster, u *clientcmdapi.AuthInfo) {
			u.ClientKey, u.ClientKeyData = "/var/run/secrets/meshca/ca-key.pem", nil
		}),
		row("certificate-authority", "certificate_authority", "uses certificate-authority", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthority, c.CertificateAuthorityData = "/etc/ssl/private/evil-ca.pem", nil
		}),
		row("insecure-skip-tls-verify", "insecure_skip_tls_verify", "uses insecure-skip-tls-verify", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.InsecureSkipTLSVerify, c.CertificateAuthorityData = true, nil
		}),
		row("http-server", "http", "http://", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.Server, c.CertificateAuthorityData = "http://127.0.0.1:1", nil
		}),
		row("server-not-a-url", "invalid_kubeconfig", "server must be an https:// URL", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.Server = "127.0.0.1:6443"
		}),
		row("proxy-url", "invalid_kubeconfig", "proxy-url must be an http, https or socks5 URL", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.ProxyURL = "socks4://127.0.0.1:1080"
		}),
		row("unusable", "invalid_kubeconfig", "unusable", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.Server = ""
		}),
		row("bad-ca-data", "build_failed", "", func(c *clientcmdapi.Cluster, _ *clientcmdapi.AuthInfo) {
			c.CertificateAuthorityData = []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
		}),
		{name: "remote secret/malformed", id: "malformed", reason: "invalid_kubeconfig", frag: "does not parse as a kubeconfig",
			kubeconfig: []byte("apiVersion: v1\nkind: Config\nclusters: {{{\n"), defence: "remote_secret:malformed"},
		// The local cluster's id: a Secret must not replace the cluster
		// meshca serves workloads of.
		{name: "remote secret/the local cluster's id", id: authpb.DefaultClusterID, reason: "duplicate_cluster_id",
			frag: "the local cluster's", kubeconfig: good, served: true, defence: "remote_secret:duplicate_local_id"},
		// A second Secret naming an id a first Secret holds.
		{name: "remote secret/an id another Secret holds", id: twinID, reason: "duplicate_cluster_id", frag: "is owned by Secret",
			kubeconfig: good, secret: "attack-twin-b", served: true, defence: "remote_secret:duplicate_secret_id"},
	}
	s.before, s.want = map[string]float64{}, map[string]float64{}
	e := scrapeMetrics(t, a.s.AdminAddr)
	for _, r := range s.rows {
		s.before[r.reason] = max(sampleValue(e, "meshca_remote_cluster_refused_total", "reason", r.reason), 0)
		s.want[r.reason]++
	}
	mark := a.s.LogMark()
	s.create(t, "attack-twin-a", twinID, good)
	if !a.s.WaitForLogAfter(mark, 15*time.Second, `"msg":"remote cluster added"`, `"cluster":"`+twinID+`"`) {
		t.Fatalf("the Secret holding %s with a working kubeconfig was not added", twinID)
	}
	for i, r := range s.rows {
		if r.secret == "" {
			s.rows[i].secret = fmt.Sprintf("attack-%02d", i)
		}
		s.create(t, s.rows[i].secret, r.id, r.kubeconfig)
	}
}

func (s *remoteSecretSurface) create(t *testing.T, name, id string, kubeconfig []byte) {
	t.Helper()
	_, err := cluster.Client.CoreV1().Secrets(s.ns).Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"istio/multiCluster": "true"}},
		Data:       map[string][]byte{id: kubeconfig},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func (s *remoteSecretSurface) checks(_ *testing.T, a *arena) []check {
	var out []check
	for _, r := range s.rows {
		out = append(out, check{name: r.name, defence: r.defence, run: func(t *testing.T) { s.check(t, a, r) }})
	}
	return out
}

func (s *remoteSecretSurface) check(t *testing.T, a *arena, r remoteRow) {
	frags := []string{`"msg":"remote cluster refused"`, `"secret":"` + s.ns + "/" + r.secret + `"`, `"cluster":"` + r.id + `"`,
		`"reason":"` + r.reason + `"`, r.frag}
	if !a.s.WaitForLog(10*time.Second, frags...) {
		t.Errorf("no log line with %q", frags)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := sampleValue(scrapeMetrics(t, a.s.AdminAddr), "meshca_remote_cluster_refused_total", "reason", r.reason) - s.before[r.reason]
		if got >= s.want[r.reason] {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("meshca_remote_cluster_refused_total{reason=%q} grew by %v, want %v", r.reason, got, s.want[r.reason])
			break
		}
	}
	if r.served {
		// The id's holder keeps it: nothing replaced it.
		if logged(a.s.Logs(), `"msg":"remote cluster replaced"`, `"cluster":"`+r.id+`"`) {
			t.Errorf("cluster %s was replaced", r.id)
		}
		return
	}
	if logged(a.s.Logs(), `"msg":"remote cluster added"`, `"cluster":"`+r.id+`"`) {
		t.Errorf("cluster %s was added", r.id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.send(ctx, probe{token: a.web.Token, noClusterID: true, md: []string{authpb.HeaderClusterID, r.id},
		req: &authpb.IstioCertificateRequest{Csr: newCSR(t, a.webID)}})
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != fmt.Sprintf("unknown cluster %q: this CA does not serve it", r.id) {
		t.Errorf("a request for cluster %s: %v %q, want Unauthenticated unknown cluster", r.id, st.Code(), st.Message())
	}
}

// logged reports whether a line of logs holds every fragment.
func logged(logs string, fragments ...string) bool {
	for _, line := range strings.Split(logs, "\n") {
		all := true
		for _, f := range fragments {
			all = all && strings.Contains(line, f)
		}
		if all {
			return true
		}
	}
	return false
}
