package e2e

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/istiodcert"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The keeper of istiod's certificate writes only a Secret meshca owns
// (issue 28, item 4). These run it against the real apiserver, as
// standalone tests and as rows of the attack matrix (istiodChecks).

// TestIstiodCertOwnership: an istiod-tls that cert-manager keeps (istio-csr's
// install) is refused, not modified, and the leader's /readyz and
// meshca_istiod_certificate_refused say whose it is; it becomes meshca's
// only when an operator hands it over (meshca.io/adopt=true).
func TestIstiodCertOwnership(t *testing.T) {
	o := refuseCertManagerSecret(t)
	o.adopt(t)
}

// TestIstiodCertSecretNames: serve refuses a CA's Secret as istiod's
// certificate's (the state's, from flags; cacerts, from the config
// file), and a keeper pointed at another meshca's CA state never writes
// it.
func TestIstiodCertSecretNames(t *testing.T) {
	t.Run("state secret by flag", checkStateSecretNameRefused)
	t.Run("cacerts in the config file", checkCacertsNameRefused)
	t.Run("a CA state under another name", checkCAStateNeverWritten)
}

// istiodOwner is a meshca keeping istiod's certificate in ns, in front of
// a Secret of cert-manager's.
type istiodOwner struct {
	ns     string
	m      *harness.Meshca
	before *corev1.Secret
}

// startKeeper runs a meshca that keeps ns/secret for istiod, elected in ns.
func startKeeper(t *testing.T, ns, secret string, extra ...string) *harness.Meshca {
	return harness.StartMeshca(t, bin, append([]string{"--kubeconfig", cluster.Kubeconfig, "--istiod-cert-secret", ns + "/" + secret,
		"--trust-lease-namespace", ns}, extra...)...)
}

// certManagerTLS is istiod-tls as cert-manager writes it for istio-csr's
// Certificate istiod, issued by the Issuer istio-ca.
func certManagerTLS(t *testing.T, ns string) *corev1.Secret {
	root := testca.NewRoot(t, "istio-csr's CA", testca.Options{})
	key, _ := pemutil.EncodePrivateKey(root.Key)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "istiod-tls", Labels: map[string]string{"controller.cert-manager.io/fao": "true"},
			Annotations: map[string]string{
				"cert-manager.io/alt-names": "istiod." + ns + ".svc", "cert-manager.io/certificate-name": "istiod",
				"cert-manager.io/common-name": "", "cert-manager.io/ip-sans": "", "cert-manager.io/uri-sans": "",
				"cert-manager.io/issuer-group": "cert-manager.io", "cert-manager.io/issuer-kind": "Issuer", "cert-manager.io/issuer-name": "istio-ca",
			}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": pemutil.EncodeCertificates(root.Cert), "tls.key": key, "ca.crt": pemutil.EncodeCertificates(root.Cert)},
	}
}

// refuseCertManagerSecret starts a keeper in front of cert-manager's
// istiod-tls and checks it refuses it: /readyz names the owner on the
// istiod-cert line (ready still), the metric says cert_manager, the log
// warns, and the Secret is as cert-manager wrote it.
func refuseCertManagerSecret(t *testing.T) *istiodOwner {
	ctx := context.Background()
	o := &istiodOwner{ns: cluster.Namespace(t, "istiod-owner")}
	var err error
	if o.before, err = cluster.Client.CoreV1().Secrets(o.ns).Create(ctx, certManagerTLS(t, o.ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	o.m = startKeeper(t, o.ns, "istiod-tls", "--state-dir", filepath.Join(t.TempDir(), "state"))
	want := `[+]istiod-cert ok: istiodcert: Secret ` + o.ns + `/istiod-tls belongs to cert-manager (Certificate "istiod", Issuer "istio-ca"): not written`
	waitUntil(t, "the refusal on /readyz", 20*time.Second, func() bool {
		code, body := readyz(t, o.m.AdminAddr)
		return code == http.StatusOK && strings.Contains(body, want)
	})
	_, body := readyz(t, o.m.AdminAddr)
	t.Logf("/readyz:\n%s", body)
	if !strings.Contains(body, "annotate it meshca.io/adopt=true") || !strings.Contains(body, "meshca.io/owner="+o.ns+"/meshca-istiod-cert") {
		t.Errorf("/readyz does not say how to make it meshca's:\n%s", body)
	}
	e := scrapeMetrics(t, o.m.AdminAddr)
	checkSamples(t, e, []wantSample{
		{"meshca_istiod_certificate_refused", map[string]string{"reason": istiodcert.RefusedCertManager}, 1, 1},
		{"meshca_istiod_certificate_refused", map[string]string{"reason": istiodcert.RefusedUnmarked}, 0, 0},
	})
	if v, ok := e.value("meshca_istiod_certificate_writes_total", map[string]string{"result": "written"}); ok && v != 0 {
		t.Errorf("meshca_istiod_certificate_writes_total{result=written} = %v, want none", v)
	}
	if !o.m.WaitForLog(5*time.Second, "istiod certificate Secret refused", `"refused":"cert_manager"`) {
		t.Errorf("no warning of the refusal in the log:\n%s", o.m.Logs())
	}
	after, err := cluster.Client.CoreV1().Secrets(o.ns).Get(ctx, "istiod-tls", metav1.GetOptions{})
	if err != nil || after.ResourceVersion != o.before.ResourceVersion || !apiequality.Semantic.DeepEqual(after.Data, o.before.Data) {
		t.Fatalf("cert-manager's Secret was modified (%v): resourceVersion %s, was %s", err, after.ResourceVersion, o.before.ResourceVersion)
	}
	return o
}

// adopt hands the Secret over and checks the keeper takes it then, and
// only then: meshca's certificate and mark, cert-manager's marks gone,
// the refusal over on /readyz and in the metric.
func (o *istiodOwner) adopt(t *testing.T) {
	ctx := context.Background()
	s, err := cluster.Client.CoreV1().Secrets(o.ns).Get(ctx, "istiod-tls", metav1.GetOptions{})
	if err != nil || s.ResourceVersion != o.before.ResourceVersion {
		t.Fatalf("cert-manager's Secret changed before it was handed over (%v)", err)
	}
	s.Annotations[istiodcert.AnnotationAdopt] = "true"
	if _, err := cluster.Client.CoreV1().Secrets(o.ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var held *istiodcert.Held
	waitUntil(t, "the adopted Secret written", 20*time.Second, func() bool {
		s, err = cluster.Client.CoreV1().Secrets(o.ns).Get(ctx, "istiod-tls", metav1.GetOptions{})
		held = istiodcert.Parse(s)
		return err == nil && held.Leaf() != nil && held.Leaf().Subject.CommonName != "istio-csr's CA"
	})
	if leaf := held.Leaf(); !held.KeyMatches || len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "istiod."+o.ns+".svc" {
		t.Errorf("adopted: leaf for %v, key matches %v", leaf.DNSNames, held.KeyMatches)
	}
	for k := range maps.Keys(s.Annotations) {
		if strings.HasPrefix(k, "cert-manager.io/") || k == istiodcert.AnnotationAdopt {
			t.Errorf("annotation %s kept after the adoption", k)
		}
	}
	if s.Annotations[istiodcert.AnnotationOwner] != o.ns+"/meshca-istiod-cert" || s.Labels[istiodcert.LabelManagedBy] != "meshca" {
		t.Errorf("adopted Secret's marks: %v %v", s.Labels, s.Annotations)
	}
	waitUntil(t, "the refusal over on /readyz", 10*time.Second, func() bool {
		_, body := readyz(t, o.m.AdminAddr)
		return strings.Contains(body, "[+]istiod-cert ok\n")
	})
	checkSamples(t, scrapeMetrics(t, o.m.AdminAddr), []wantSample{
		{"meshca_istiod_certificate_refused", map[string]string{"reason": istiodcert.RefusedCertManager}, 0, 0},
		{"meshca_istiod_certificate_writes_total", map[string]string{"reason": istiodcert.ReasonAdopted, "result": "written"}, 1, 1},
	})
}

// readyz reads /readyz.
func readyz(t *testing.T, adminAddr string) (int, string) {
	t.Helper()
	r, err := http.Get("http://" + adminAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	body, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(body)
}

// serveRefused runs `meshca serve` with args, which it must refuse before
// it serves, saying want.
func serveRefused(t *testing.T, want string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"serve", "--kubeconfig", cluster.Kubeconfig, "--listen", "127.0.0.1:0", "--admin-listen", ""}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil || ctx.Err() != nil || !strings.Contains(out.String(), want) {
		t.Fatalf("meshca serve %v: %v, want a refusal saying %q:\n%s", args, err, want, out.String())
	}
}

// checkStateSecretNameRefused: --istiod-cert-secret equal to --state-secret.
func checkStateSecretNameRefused(t *testing.T) {
	ns := cluster.Namespace(t, "istiod-state-name")
	serveRefused(t, `--istiod-cert-secret "`+ns+`/meshca-ca-state" is the CA state's Secret (--state-secret), which holds the CA's keys`,
		"--state-secret", ns+"/meshca-ca-state", "--istiod-cert-secret", ns+"/meshca-ca-state", "--trust-lease-namespace", ns)
	if _, err := cluster.Client.CoreV1().Secrets(ns).Get(context.Background(), "meshca-ca-state", metav1.GetOptions{}); err == nil {
		t.Error("meshca wrote the state Secret before it refused its configuration")
	}
}

// checkCacertsNameRefused: istiodCertSecret naming Istio's cacerts in the
// config file.
func checkCacertsNameRefused(t *testing.T) {
	file := filepath.Join(t.TempDir(), "config.yaml")
	config := "apiVersion: meshca.io/v1alpha1\nkind: ServeConfig\nstateDir: " + filepath.Join(t.TempDir(), "state") +
		"\nistiodCertSecret: istio-system/cacerts\ntrustLeaseNamespace: istio-system\n"
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	serveRefused(t, `--istiod-cert-secret "istio-system/cacerts" is Istio's CA Secret cacerts, which holds a CA's private key`, "--config", file)
}

// checkCAStateNeverWritten: one meshca keeps its CA state in ns/ca-keys;
// another, whose own state is elsewhere (no flag can compare them), is
// told to keep istiod's certificate there. It refuses: the Secret holds
// a CA's keys, whatever its marks say (the state's label is meshca's),
// and even handed over.
func checkCAStateNeverWritten(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "istiod-ca-keys")
	owner := harness.StartMeshca(t, bin, "--kubeconfig", cluster.Kubeconfig, "--state-secret", ns+"/ca-keys")
	owner.Stop()
	state, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "ca-keys", metav1.GetOptions{})
	if err != nil || state.Data[keymgr.EntryState] == nil {
		t.Fatalf("no CA state in %s/ca-keys: %v", ns, err)
	}
	state.Annotations = map[string]string{istiodcert.AnnotationAdopt: "true"}
	if state, err = cluster.Client.CoreV1().Secrets(ns).Update(ctx, state, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	m := startKeeper(t, ns, "ca-keys", "--state-dir", filepath.Join(t.TempDir(), "state"))
	waitUntil(t, "the refusal on /readyz", 20*time.Second, func() bool {
		_, body := readyz(t, m.AdminAddr)
		return strings.Contains(body, "[+]istiod-cert ok: istiodcert: Secret "+ns+"/ca-keys is not istiod's certificate: it holds a CA's private key")
	})
	checkSamples(t, scrapeMetrics(t, m.AdminAddr), []wantSample{
		{"meshca_istiod_certificate_refused", map[string]string{"reason": istiodcert.RefusedCAKey}, 1, 1},
	})
	after, _ := cluster.Client.CoreV1().Secrets(ns).Get(ctx, "ca-keys", metav1.GetOptions{})
	if after.ResourceVersion != state.ResourceVersion || !apiequality.Semantic.DeepEqual(after.Data, state.Data) {
		t.Fatal("the keeper wrote another meshca's CA state")
	}
}
