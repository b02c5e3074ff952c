package chart

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/ca/caclient"
	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/integration/harness/checked"
	"github.com/meshca/meshca/internal/pemutil"
	"github.com/meshca/meshca/internal/testca"
	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/certs"
	"github.com/meshca/meshca/signer/k8scsr/k8scsrtest"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
)

// csrRule is the one rule signer.type k8scsr adds to the ClusterRole.
var csrRule = rbacv1.PolicyRule{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
	Verbs: []string{"create", "get", "list", "watch", "delete"}}

// checkK8sCSR: meshca serve gets the backend's flags and the serving
// certificate, the rotation Jobs run `meshca root` on the CA state without
// --signer (it has no k8scsr side), and the ClusterRole adds exactly
// create, get, list, watch and delete on CertificateSigningRequests. The
// scenario's RBAC, applied for real under a release of its own, is then
// put to the apiserver's authorizer: approving and signing are denied.
func checkK8sCSR(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	d := deployment(t, objs)
	wantArgs(t, "serve", d.Spec.Template.Spec.Containers[0].Args, []string{"--signer=k8scsr", "--k8scsr-signer-name=example.com/meshca",
		"--serving-cert-file=/etc/meshca/serving/tls.crt", "--serving-key-file=/etc/meshca/serving/tls.key", "--state-secret=" + ns + "/meshca-ca-state"},
		[]string{"--trust-anchors", "--k8scsr-kubeconfig", "--kubeconfig"})
	wantSecretVolumes(t, "Deployment", d.Spec.Template.Spec.Volumes, map[string]string{"serving": "meshca-serving"})
	for _, step := range []string{"retire", "activate"} {
		c := cronJob(t, objs, step)
		checkRotationJob(t, c, step, ns)
		j := c.Spec.JobTemplate.Spec.Template.Spec
		wantArgs(t, c.Name, j.Containers[0].Args, nil, []string{"--signer", "--k8scsr", "--serving-cert-file"})
		if len(j.Volumes) != 0 {
			t.Errorf("CronJob %s volumes %+v: want none (the steps read the state Secret alone)", c.Name, j.Volumes)
		}
	}
	r := clusterRole(t, objs)
	checkClusterRole(t, r, []string{"tokenreviews", "pods", "certificatesigningrequests"})
	wantRules(t, "ClusterRole meshca's last rule", r.Rules[len(r.Rules)-1:], []rbacv1.PolicyRule{csrRule})

	file := filepath.Join(harness.ChartDir(), "ci", "k8scsr-values.yaml")
	const release, sa = "csr-scenario", "csr-scenario-meshca"
	out, err := harness.HelmTemplate(helm, release, ns, "--values", file)
	if err != nil {
		t.Fatal(err)
	}
	all, err := harness.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	rbac := slices.DeleteFunc(all, func(o *unstructured.Unstructured) bool {
		return !slices.Contains([]string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}, o.GetKind())
	})
	apply(t, rbac, false)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(ctx, sa, metav1.DeleteOptions{})
		_ = cluster.Client.RbacV1().ClusterRoles().Delete(ctx, sa, metav1.DeleteOptions{})
	})
	checkK8sCSRAccess(t, ns, sa, "example.com/meshca")
}

// checkK8sCSRAccess asks the authorizer about the CertificateSigningRequest
// backend's requests as ns/sa: what meshca does is allowed; approving,
// signing, and writing a request's status or approval are not.
func checkK8sCSRAccess(t *testing.T, ns, sa, signerName string) {
	t.Helper()
	const certs = "certificates.k8s.io"
	csr := func(verb, sub, name string) harness.Access {
		res := "certificatesigningrequests"
		if sub != "" {
			res += "/" + sub
		}
		return harness.Access{Verb: verb, Group: certs, Resource: res, Name: name}
	}
	signers := func(verb, name string) harness.Access {
		return harness.Access{Verb: verb, Group: certs, Resource: "signers", Name: name}
	}
	tests := []struct {
		a       harness.Access
		allowed bool
	}{
		{csr("create", "", ""), true},
		{csr("get", "", "meshca-0a1b2c3d-x7k2p"), true},
		{csr("list", "", ""), true},
		{csr("watch", "", ""), true},
		{csr("delete", "", "meshca-0a1b2c3d-x7k2p"), true},

		{signers("approve", signerName), false},
		{signers("approve", "example.com/*"), false},
		{signers("approve", "kubernetes.io/kube-apiserver-client"), false},
		{signers("sign", signerName), false},
		{signers("attest", signerName), false},
		{csr("update", "approval", "meshca-0a1b2c3d-x7k2p"), false},
		{csr("patch", "approval", "meshca-0a1b2c3d-x7k2p"), false},
		{csr("update", "status", "meshca-0a1b2c3d-x7k2p"), false},
		{csr("patch", "status", "meshca-0a1b2c3d-x7k2p"), false},
		{csr("update", "", "meshca-0a1b2c3d-x7k2p"), false},
		{csr("patch", "", "meshca-0a1b2c3d-x7k2p"), false},
		{csr("deletecollection", "", ""), false},
		{harness.Access{Verb: "create", Group: certs, Resource: "podcertificaterequests", Namespace: "any-app"}, false},
		{harness.Access{Verb: "create", Group: certs, Resource: "clustertrustbundles"}, false},
		{harness.Access{Verb: "list", Resource: "secrets", Namespace: ns}, false},
	}
	for _, tt := range tests {
		got, err := cluster.Allowed(context.Background(), ns, sa, tt.a)
		if err != nil {
			t.Fatal(err)
		}
		if got != tt.allowed {
			t.Errorf("%s: %s allowed %v, want %v", sa, tt.a, got, tt.allowed)
		}
	}
}

// TestChartK8sCSR installs the k8scsr scenario for real (its own release
// and signer name) and runs it as an operator would: the controller's
// issuing intermediate and root imported into the chart's CA state Secret
// with `meshca root prepare --external --cert --root` under the rotation
// Jobs' account, meshca run with the
// Deployment's own arguments (its Secret files written where the mounts
// put them) under its ServiceAccount's token, and a controller approving
// and signing the requests as an admin. A workload's SVID is issued
// through a CertificateSigningRequest, which meshca deletes; then the
// CronJobs' commands take their steps on that state or say why not.
func TestChartK8sCSR(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "chart-k8scsr")
	const release, sa = "csr", "csr-meshca"
	signerName := fmt.Sprintf("meshca.test/chart-%d", time.Now().UnixNano()%1e9)
	out, err := harness.HelmTemplate(helm, release, ns, "--values", filepath.Join(harness.ChartDir(), "ci", "k8scsr-values.yaml"),
		"--set", "signer.k8scsr.signerName="+signerName)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := harness.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	apply(t, objs, false)

	// The controller signs with an intermediate of root; meshca's serving
	// certificate (the Secret meshca-serving) chains to root through
	// another.
	root := testca.NewRoot(t, "corp root", testca.Options{})
	issuing := root.NewIntermediate(t, "corp issuing intermediate", testca.Options{})
	inter := root.NewIntermediate(t, "corp serving intermediate", testca.Options{})
	serverName := sa + "." + ns + ".svc"
	serving, err := keymgr.IssueServing(inter.Authority(), keymgr.ServingOptions{Names: []string{serverName}})
	if err != nil {
		t.Fatal(err)
	}
	servingKey, err := pemutil.EncodePrivateKey(serving.PrivateKey.(crypto.Signer))
	if err != nil {
		t.Fatal(err)
	}
	files := t.TempDir() // what the Deployment mounts at /etc/meshca
	write := func(name string, data []byte) string {
		t.Helper()
		path := filepath.Join(files, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("serving/tls.crt", pemutil.EncodeCertificates(serving.Leaf, inter.Cert))
	write("serving/tls.key", servingKey)

	state := ns + "/csr-meshca-ca-state"
	rotation := cluster.ServiceAccountKubeconfig(t, ns, "csr-meshca-root-rotation")
	runMeshca(t, []string{"root", "prepare", "--external", "--cert", write("issuing.pem", pemutil.EncodeCertificates(issuing.Cert)),
		"--root", write("root.pem", pemutil.EncodeCertificates(root.Cert)), "--state-secret", state, "--kubeconfig", rotation}, 0, "active")
	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", sa), &d)
	var args []string
	for _, a := range containerArgs(t, d.Spec.Template.Spec.Containers[0], ns) {
		args = append(args, strings.ReplaceAll(a, "/etc/meshca/", files+"/"))
	}

	runCtx, cancel := context.WithCancel(ctx)
	ctl := &k8scsrtest.Controller{Client: cluster.Client, SignerName: signerName, Answer: k8scsrtest.Issue(issuing.Authority(), 0)}
	done := make(chan struct{})
	go func() { defer close(done); ctl.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, err := range ctl.Errors() {
			t.Errorf("the signer's controller: %v", err)
		}
	})
	m := harness.StartMeshca(t, bin, append(args, "--kubeconfig", cluster.ServiceAccountKubeconfig(t, ns, sa))...)

	apps := cluster.Namespace(t, "chart-k8scsr-apps")
	w := cluster.NewWorkload(t, apps, "frontend", "node-a")
	c, err := checked.NewClient(t, caclient.Config{Addr: m.Addr, ServerName: serverName, Roots: certs.Pool(root.Cert),
		ClusterID: "Kubernetes", TokenFile: harness.WriteToken(t, w.Token)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := spiffeid.RequireFromSegments(spiffeid.RequireTrustDomainFromString("cluster.local"), "ns", apps, "sa", "frontend")
	svid, err := c.Fetch(ctx, id, caclient.Options{})
	if err != nil {
		t.Fatalf("meshca under the chart's RBAC could not issue through a CertificateSigningRequest: %v\n%s", err, m.Logs())
	}
	if err := svid.Chain[0].CheckSignatureFrom(issuing.Cert); err != nil || len(svid.Chain) != 2 || !svid.Chain[1].Equal(issuing.Cert) ||
		len(svid.Roots) != 1 || !svid.Roots[0].Equal(root.Cert) {
		t.Errorf("SVID issued by %q, chain of %d, roots %d: want the controller's intermediate sent with the leaf, and its root, the ones imported (%v)",
			svid.Chain[0].Issuer, len(svid.Chain), len(svid.Roots), err)
	}
	if !m.WaitForLog(5*time.Second, `"backend":"k8scsr"`, `"code":"OK"`) {
		t.Error("no audit event of an issuance by the k8scsr backend")
	}
	left, err := cluster.Client.CertificatesV1().CertificateSigningRequests().List(ctx,
		metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.signerName", signerName).String()})
	if err != nil || len(left.Items) != 0 {
		t.Errorf("CertificateSigningRequests left behind: %v %v", left, err)
	}
	if logs := m.Logs(); strings.Contains(logs, "forbidden") || strings.Contains(logs, "not allowed") {
		t.Errorf("meshca was refused a request:\n%s", logs)
	}

	t.Run("rotation", func(t *testing.T) {
		job := func(step string) []string {
			var c batchv1.CronJob
			convert(t, find(t, objs, "CronJob", "csr-meshca-root-"+step), &c)
			return append(slices.Clone(c.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args), "--kubeconfig", rotation)
		}
		next := write("next.pem", pemutil.EncodeCertificates(testca.NewRoot(t, "corp root 2", testca.Options{}).Cert))
		runMeshca(t, job("retire"), 2, "no previous authority")
		runMeshca(t, job("activate"), 2, "no prepared authority")
		runMeshca(t, []string{"root", "prepare", "--external", "--cert", next, "--state-secret", state, "--kubeconfig", rotation}, 0, "prepared")
		runMeshca(t, job("activate"), 1, "refused")
	})
}

// runMeshca runs meshca with args and checks its exit code and that its
// output says want, and nothing was forbidden.
func runMeshca(t *testing.T, args []string, code int, want string) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	got := 0
	var ee *exec.ExitError
	if err := cmd.Run(); errors.As(err, &ee) {
		got = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if got != code || !strings.Contains(out.String(), want) || strings.Contains(out.String(), "forbidden") {
		t.Errorf("meshca %s: exit %d, want %d saying %q:\n%s", strings.Join(args, " "), got, code, want, out.String())
	}
}
