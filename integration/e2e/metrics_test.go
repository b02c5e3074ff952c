package e2e

import (
	"context"
	"crypto"
	"crypto/x509"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"
	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// issueMetrics are the metrics issue 10 asks a running meshca to export:
// Istio's citadel_server_* names kept; gRPC server metrics by method and
// code (go-grpc-middleware's provider); Vault login state and token TTL;
// signer latency and errors by backend; rotation state and the bundle
// sequence; leader status; rate-limit rejections.
var issueMetrics = []string{
	"citadel_server_csr_count",
	"citadel_server_authentication_failure_count",
	"citadel_server_success_cert_issuance_count",
	"citadel_server_csr_sign_err_count",
	"citadel_server_root_cert_expiry_timestamp",
	"citadel_server_root_cert_expiry_seconds",
	"citadel_server_cert_chain_expiry_timestamp",
	"citadel_server_cert_chain_expiry_seconds",
	"grpc_server_started_total",
	"grpc_server_handled_total",
	"grpc_server_handling_seconds",
	"meshca_vault_logged_in",
	"meshca_vault_token_ttl_seconds",
	"meshca_sign_duration_seconds",
	"meshca_sign_errors_total",
	"meshca_ca_authorities",
	"meshca_ca_root_expiry_timestamp",
	"meshca_rotation_steps_total",
	"meshca_trust_bundle_sequence",
	"meshca_leader",
	"meshca_rate_limited_total",
}

// vaultOnly tells the metrics only a meshca signing with Vault exports,
// or with a serving certificate of the operator's (--serving-cert-file:
// its reloads), which the Vault one is given.
func vaultOnly(name string) bool {
	return strings.HasPrefix(name, "meshca_vault_") || strings.HasPrefix(name, "meshca_serving_certificate_reload")
}

// istiodOnly tells the metrics only a meshca keeping istiod's
// certificate exports.
func istiodOnly(name string) bool { return strings.HasPrefix(name, "meshca_istiod_") }

// upstreamOnly: the metrics of an intermediate renewed from an upstream,
// which a server exports with --upstream.
func upstreamOnly(name string) bool { return strings.HasPrefix(name, "meshca_intermediate_") }

// crlOnly: the expiry of the CRLs published as istio-ca-crl, which the
// leader exports while it publishes some (--publish-crl).
func crlOnly(name string) bool { return strings.HasPrefix(name, "meshca_trust_crl_") }

// wantSample is a sample a scrape must hold, with a value in [min, max].
type wantSample struct {
	name     string
	labels   map[string]string
	min, max float64
}

func checkSamples(t *testing.T, e *exposition, want []wantSample) {
	t.Helper()
	for _, w := range want {
		v, ok := e.value(w.name, w.labels)
		if !ok || v < w.min || v > w.max {
			t.Errorf("%s%v = %v (exported once: %v), want in [%v, %v]", w.name, w.labels, v, ok, w.min, w.max)
		}
	}
}

// TestMetrics scrapes running meshcas: after one issued and one refused
// request each, the built-in CA with the trust publisher on (so that it
// campaigns for a Lease) and the Vault backend; one keeping istiod's
// certificate, once written; one publishing its CRLs, once published. Between them they must
// export every metric issue 10 names and every metric that the Grafana
// dashboard's queries and the alerts' expressions use.
func TestMetrics(t *testing.T) {
	var builtin, withVault, withIstiod, withUpstream, withCRL *exposition
	t.Run("built-in", func(t *testing.T) { builtin = scrapeBuiltin(t) })
	t.Run("crl", func(t *testing.T) { withCRL = scrapeCRL(t) })
	t.Run("vault", func(t *testing.T) { withVault = scrapeVault(t) })
	t.Run("istiod", func(t *testing.T) { withIstiod = scrapeIstiod(t) })
	t.Run("upstream", func(t *testing.T) { withUpstream = scrapeUpstream(t) })
	if builtin == nil || withVault == nil || withIstiod == nil || withUpstream == nil || withCRL == nil {
		t.Fatal("no scrape to check")
	}
	exporter := func(name string) *exposition {
		switch {
		case vaultOnly(name):
			return withVault
		case istiodOnly(name):
			return withIstiod
		case upstreamOnly(name):
			return withUpstream
		case crlOnly(name):
			return withCRL
		}
		return builtin
	}
	t.Run("named in the issue", func(t *testing.T) {
		for _, name := range issueMetrics {
			if !exporter(name).exports(name) {
				t.Errorf("%s is not exported", name)
			}
		}
	})
	t.Run("used by the dashboard and the alerts", func(t *testing.T) {
		queries := append(dashboardQueries(t), alertExpressions(t)...)
		used := map[string]bool{}
		for _, q := range queries {
			names := promqlMetricNames(q.expr)
			if len(names) == 0 && scrapeHealth.MatchString(q.expr) {
				continue // Prometheus's own up{job=...}: whether meshca is scraped at all (MeshcaDown)
			}
			if len(names) == 0 {
				t.Errorf("%s: found no meshca, citadel or grpc metric in %q", q.where, q.expr)
			}
			for _, name := range names {
				used[name] = true
				if !exporter(name).exports(name) {
					t.Errorf("%s uses %s, which a running meshca does not export: %q", q.where, name, q.expr)
				}
			}
		}
		t.Logf("%d queries use %d metric names", len(queries), len(used))
	})
}

// request sends one request that is issued, with w's bound token, and
// one that is refused, with a token that is no JWT.
func request(t *testing.T, issue func(token string) error, w *harness.Workload) {
	t.Helper()
	if err := issue(w.Token); err != nil {
		t.Fatalf("issued request: %v", err)
	}
	if err := issue("not-a-token"); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("refused request: %v, want Unauthenticated", err)
	}
}

// scrapeCRL scrapes a meshca publishing its CA state's CRLs as
// istio-ca-crl into one namespace, once it has: the CRL keeper issues
// them (issue 30's keymgr half; without it a state has no CRL and this
// fails).
func scrapeCRL(t *testing.T) *exposition {
	ns := cluster.Namespace(t, "metrics-crl")
	s := startServer(t, "--crl", "--publish-crl", "--trust-lease-namespace", ns, "--trust-namespace-selector", "kubernetes.io/metadata.name="+ns)
	var e *exposition
	waitUntil(t, "istio-ca-crl published", 30*time.Second, func() bool {
		e = scrapeMetrics(t, s.AdminAddr)
		return e.exports("meshca_trust_crl_next_update_timestamp_seconds")
	})
	now := float64(time.Now().Unix())
	checkSamples(t, e, []wantSample{
		{"meshca_trust_crl_next_update_timestamp_seconds", nil, now, now + 25*3600},
		{"meshca_trust_crl_this_update_timestamp_seconds", nil, now - 3600, now},
		{"meshca_trust_writes_total", map[string]string{"document": "crl", "result": "created"}, 1, 1},
	})
	return e
}

// scrapeIstiod scrapes a meshca keeping istiod's certificate once it has
// written it.
func scrapeIstiod(t *testing.T) *exposition {
	ns := cluster.Namespace(t, "metrics-istiod")
	s := startServer(t, "--istiod-cert-secret", ns+"/istiod-tls", "--trust-lease-namespace", ns)
	var e *exposition
	waitUntil(t, "istiod's certificate written", 20*time.Second, func() bool {
		e = scrapeMetrics(t, s.AdminAddr)
		v, _ := e.value("meshca_istiod_certificate_writes_total", map[string]string{"reason": "missing", "result": "written"})
		return v == 1
	})
	checkSamples(t, e, []wantSample{
		{"meshca_istiod_certificate_refused", map[string]string{"reason": "cert_manager"}, 0, 0},
		{"meshca_istiod_certificate_expiry_timestamp_seconds", nil, float64(time.Now().Unix()), float64(time.Now().Add(25 * time.Hour).Unix())},
	})
	return e
}

func scrapeBuiltin(t *testing.T) *exposition {
	s := startServer(t, "--publish-root-cert-configmaps", "--trust-lease-namespace", cluster.Namespace(t, "metrics-lease"),
		"--trust-namespace-selector", "meshca.io/metrics-test=none")
	w := cluster.NewWorkload(t, cluster.Namespace(t, "metrics"), "frontend", "node-a")
	request(t, func(token string) error {
		_, err := s.client(t, token).Fetch(context.Background(), workloadID(w), caclient.Options{})
		return err
	}, w)
	// The single replica takes the fresh Lease at once.
	var e *exposition
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		e = scrapeMetrics(t, s.AdminAddr)
		if v, _ := e.value("meshca_leader", map[string]string{"lease": "meshca-trust-publisher"}); v == 1 || time.Now().After(deadline) {
			break
		}
	}
	method := map[string]string{"grpc_service": "istio.v1.auth.IstioCertificateService", "grpc_method": "CreateCertificate"}
	code := func(c string) map[string]string {
		return map[string]string{"grpc_method": "CreateCertificate", "grpc_code": c}
	}
	checkSamples(t, e, []wantSample{
		{"grpc_server_started_total", method, 2, 2},
		{"grpc_server_handled_total", code("OK"), 1, 1},
		{"grpc_server_handled_total", code("Unauthenticated"), 1, 1},
		{"grpc_server_handled_total", code("ResourceExhausted"), 0, 0},
		{"grpc_server_handling_seconds_count", method, 2, 2},
		{"citadel_server_success_cert_issuance_count", nil, 1, 1},
		{"citadel_server_authentication_failure_count", nil, 1, 1},
		{"meshca_requests_total", map[string]string{"code": "OK"}, 1, 1},
		{"meshca_requests_total", map[string]string{"code": "Unauthenticated", "reason": "token_malformed"}, 1, 1},
		{"meshca_sign_duration_seconds_count", map[string]string{"backend": "local"}, 1, 1},
		{"meshca_sign_errors_total", map[string]string{"backend": "local", "kind": "unavailable"}, 0, 0},
		{"meshca_rate_limited_total", map[string]string{"reason": "too_many_requests"}, 0, 0},
		{"meshca_rate_limited_total", map[string]string{"reason": "too_many_authentications"}, 0, 0},
		{"meshca_leader", map[string]string{"lease": "meshca-trust-publisher"}, 1, 1},
		{"meshca_ca_authorities", map[string]string{"phase": "active"}, 1, 1},
		{"meshca_trust_bundle_sequence", nil, 1, 1e9},
		{"meshca_rotation_steps_total", map[string]string{"verb": "prepare"}, 0, 0},
		{"citadel_server_root_cert_expiry_seconds", nil, 365 * 86400, 11 * 365 * 86400},
		{"meshca_serving_certificate_expiry_timestamp_seconds", nil, float64(time.Now().Add(20 * 24 * time.Hour).Unix()), float64(time.Now().Add(31 * 24 * time.Hour).Unix())},
	})
	return e
}

// scrapeUpstream scrapes a server renewing its intermediate from the
// self upstream, after one issued and one refused request.
func scrapeUpstream(t *testing.T) *exposition {
	s := startServer(t, "--upstream", "self")
	w := cluster.NewWorkload(t, cluster.Namespace(t, "metrics-upstream"), "frontend", "node-a")
	request(t, func(token string) error {
		_, err := s.client(t, token).Fetch(context.Background(), workloadID(w), caclient.Options{})
		return err
	}, w)
	e := scrapeMetrics(t, s.AdminAddr)
	now := float64(time.Now().Unix())
	self := map[string]string{"upstream": "self"}
	checkSamples(t, e, []wantSample{
		{"meshca_intermediate_expiry_timestamp", self, now + 71*3600, now + 73*3600},
		{"meshca_intermediate_start_timestamp", self, now - 600, now},
		{"meshca_intermediate_renewal_failures", self, 0, 0},
		{"meshca_intermediate_renewals_total", map[string]string{"upstream": "self", "result": "ok"}, 0, 0},
		{"citadel_server_cert_chain_expiry_seconds", nil, 71 * 3600, 73 * 3600},
	})
	return e
}

func scrapeVault(t *testing.T) *exposition {
	vaultBin, err := harness.VaultBinary()
	if err != nil {
		t.Fatalf("the real Vault is required: %v", err)
	}
	v := harness.StartVault(t, vaultBin)
	root := testca.NewRoot(t, "metrics corp root", testca.Options{})
	inter := root.NewIntermediate(t, "metrics vault intermediate", testca.Options{})
	v.ConfigurePKI(t, "pki", inter.Authority(), harness.VaultRole{})
	// A renewable token of an hour, as an operator's would be (the dev
	// root token never expires).
	renewable := true
	tok, err := v.Client.Auth().Token().CreateWithContext(context.Background(),
		&api.TokenCreateRequest{Policies: []string{"root"}, TTL: "1h", Renewable: &renewable})
	if err != nil {
		t.Fatal(err)
	}
	serving, err := keymgr.IssueServing(inter.Authority(), keymgr.ServingOptions{Names: []string{"istiod.istio-system.svc"}})
	if err != nil {
		t.Fatal(err)
	}
	servingKey, err := pemutil.EncodePrivateKey(serving.PrivateKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	m := harness.StartMeshca(t, bin, "--signer", "vault", "--kubeconfig", cluster.Kubeconfig,
		"--vault-addr", v.Addr, "--vault-pki-mount", "pki", "--vault-role", harness.VaultMainRole,
		"--vault-token-file", file("vault.token", []byte(tok.Auth.ClientToken)),
		"--trust-anchors", file("anchors.pem", pemutil.EncodeCertificates(root.Cert)),
		"--serving-cert-file", file("serving.pem", pemutil.EncodeCertificates(serving.Leaf, inter.Cert)),
		"--serving-key-file", file("serving-key.pem", servingKey))
	w := cluster.NewWorkload(t, cluster.Namespace(t, "metrics-vault"), "frontend", "node-a")
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	request(t, func(token string) error {
		c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: "istiod.istio-system.svc", Roots: roots, TokenFile: harness.WriteToken(t, token)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Fetch(context.Background(), workloadID(w), caclient.Options{})
		return err
	}, w)
	e := scrapeMetrics(t, m.AdminAddr)
	checkSamples(t, e, []wantSample{
		{"meshca_vault_logged_in", nil, 1, 1},
		{"meshca_vault_token_ttl_seconds", nil, 50 * 60, 3600},
		{"meshca_sign_duration_seconds_count", map[string]string{"backend": "vault"}, 1, 1},
		{"meshca_sign_errors_total", map[string]string{"backend": "vault", "kind": "refused"}, 0, 0},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "CreateCertificate", "grpc_code": "OK"}, 1, 1},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "CreateCertificate", "grpc_code": "Unauthenticated"}, 1, 1},
		{"meshca_serving_certificate_expiry_timestamp_seconds", nil, float64(serving.Leaf.NotAfter.Unix()), float64(serving.Leaf.NotAfter.Unix())},
		{"meshca_serving_certificate_reloads_total", map[string]string{"result": "reloaded"}, 0, 0},
		{"meshca_serving_certificate_reload_failing", nil, 0, 0},
	})
	return e
}

// scrapeHealth matches Prometheus's own series of a scrape target, up,
// selected by job: the one metric an alert may use that meshca does not
// export.
var scrapeHealth = regexp.MustCompile(`\bup\{job=`)
