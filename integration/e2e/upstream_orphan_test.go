package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/integration/harness"
	"github.com/meshca/meshca/keymgr/secretstore"
)

// readOnlyState is a kubeconfig of a service account that may get the
// state Secret ns/meshca-ca but not update it: a prepare with it makes
// its root in the upstream, then fails to record it.
func readOnlyState(t *testing.T, ns string) string {
	t.Helper()
	ctx := context.Background()
	cluster.ServiceAccount(t, ns, "reader")
	rbac := cluster.Client.RbacV1()
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "state-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"},
			ResourceNames: []string{"meshca-ca"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "state-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "state-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return cluster.ServiceAccountKubeconfig(t, ns, "reader")
}

// TestUpstreamPrepareOrphan: `meshca root prepare --upstream` that makes
// its root key in the real Vault and then cannot record it (the state
// Secret may be read, not written) leaves no key there unnamed: the
// vault-pki issuer it made is deleted, and the Transit key, which Vault
// will not delete (deletion_allowed), is named in the error for an
// operator to delete.
func TestUpstreamPrepareOrphan(t *testing.T) {
	v, token := startVault(t)
	v.MountPKI(t, "pki-mesh")
	v.MountTransit(t, "transit")
	ns := cluster.Namespace(t, "upstream-orphan")
	secret := ns + "/meshca-ca"
	if out, err := exec.Command(bin, "root", "prepare", "--state-secret", secret, "--kubeconfig", cluster.Kubeconfig).CombinedOutput(); err != nil {
		t.Fatalf("bootstrap: %v\n%s", err, out)
	}
	reader := readOnlyState(t, ns)
	prepare := func(flags ...string) string {
		t.Helper()
		args := append([]string{"root", "prepare", "--state-secret", secret, "--kubeconfig", reader, "--vault-addr", v.Addr, "--vault-token-file", token}, flags...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "forbidden") {
			t.Fatalf("prepare %v with a state it cannot write: %v, want it refused by the apiserver\n%s", flags, err, out)
		}
		t.Logf("prepare %v:\n%s", flags, out)
		return string(out)
	}
	ctx := context.Background()

	out := prepare("--upstream", "vault-pki", "--vault-pki-mount", "pki-mesh")
	if !regexp.MustCompile(`the new root's key vault-pki \([0-9a-f-]+\), recorded nowhere, was destroyed`).MatchString(out) {
		t.Errorf("vault-pki: the error does not say the new issuer was destroyed")
	}
	if l, err := v.Client.Logical().ListWithContext(ctx, "pki-mesh/issuers"); err != nil || l != nil && len(l.Data["keys"].([]any)) != 0 {
		t.Errorf("vault-pki: the mount keeps issuers %v (%v), want none", l, err)
	}

	out = prepare("--upstream", "vault-transit")
	l, err := v.Client.Logical().ListWithContext(ctx, "transit/keys")
	if err != nil || l == nil || len(l.Data["keys"].([]any)) != 1 {
		t.Fatalf("Transit holds %v (%v), want the one key prepare made", l, err)
	}
	key := l.Data["keys"].([]any)[0].(string)
	if !strings.Contains(out, "the new root key "+key+":1 in upstream vault-transit is recorded in no CA state and was not destroyed") ||
		!strings.Contains(out, "deletion_allowed is false") {
		t.Errorf("vault-transit: the error does not name the key %s left in Vault, and why", key)
	}
}

// TestUpstreamFirstStartRace: four replicas of meshca serve --upstream
// vault-pki start at once on one empty state Secret against the real
// Vault. Each may make a root issuer before one of them bootstraps the
// state; the others destroy theirs: afterwards Vault holds exactly the
// issuer of the state's one root.
func TestUpstreamFirstStartRace(t *testing.T) {
	v, token := startVault(t)
	v.MountPKI(t, "pki-mesh")
	ns := cluster.Namespace(t, "upstream-race")
	args := []string{"--state-secret", ns + "/meshca-ca", "--kubeconfig", cluster.Kubeconfig, "--upstream", "vault-pki", "--vault-addr", v.Addr,
		"--vault-token-file", token, "--vault-pki-mount", "pki-mesh", "--auto-rotate=false", "--trust-lease-namespace", ns}
	const replicas = 4
	type started struct {
		m   *harness.Meshca
		err error
	}
	ch := make(chan started, replicas)
	for range replicas {
		go func() {
			m, err := harness.StartMeshcaProcess(bin, args...)
			ch <- started{m, err}
		}()
	}
	var servers []*harness.Meshca
	for range replicas {
		s := <-ch
		if s.err != nil {
			t.Error(s.err)
			continue
		}
		servers = append(servers, s.m)
		t.Cleanup(s.m.Stop)
	}
	if t.Failed() {
		return
	}
	st := loadState(t, &secretstore.Store{Client: cluster.Client, Namespace: ns, Name: "meshca-ca"})
	if len(st.Authorities) != 1 {
		t.Fatalf("the state holds %d authorities, want the one bootstrapped", len(st.Authorities))
	}
	l, err := v.Client.Logical().ListWithContext(context.Background(), "pki-mesh/issuers")
	if err != nil || l == nil {
		t.Fatal(err)
	}
	issuers := l.Data["keys"].([]any)
	destroyed := 0
	for _, m := range servers {
		destroyed += strings.Count(m.Logs(), "another replica bootstrapped first; the root key made for this one is destroyed")
	}
	harness.Report(t, "%d replicas at once: %d lost the race after making a root and destroyed it; Vault holds %d issuers", replicas, destroyed, len(issuers))
	if len(issuers) != 1 || issuers[0] != st.Active().Upstream.Key {
		t.Fatalf("Vault holds issuers %v, want the state's root's alone (%s)", issuers, st.Active().Upstream.Key)
	}
}
