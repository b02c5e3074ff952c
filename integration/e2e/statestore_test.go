package e2e

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/meshca/meshca/keymgr/storetest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const stateSecret = "meshca-state"

// TestStateStoreSecret runs the StateStore contract on a Secret in the
// real kube-apiserver, whose resourceVersion preconditions are the
// compare-and-swap.
func TestStateStoreSecret(t *testing.T) {
	storetest.Run(t, func(t *testing.T) keymgr.StateStore {
		return secretstore.Store{Client: cluster.Client, Namespace: cluster.Namespace(t, "statestore"), Name: stateSecret}
	})
}

// TestStateStoreSecretPrecreated: an operator creates the Secret empty and
// grants meshca get and update on that one name only (RBAC cannot scope
// create to a name). The first Saves race on it: one fills it, the others
// get ErrConflict; the operator's labels stay.
func TestStateStoreSecretPrecreated(t *testing.T) {
	ns := cluster.Namespace(t, "statestore")
	ctx := context.Background()
	_, err := cluster.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: stateSecret, Labels: map[string]string{"team": "mesh"}},
		Type:       corev1.SecretTypeOpaque,
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := secretstore.Store{Client: narrowClient(t, ns), Namespace: ns, Name: stateSecret}
	if _, _, err := st.Load(ctx); !errors.Is(err, keymgr.ErrNoState) {
		t.Fatalf("Load of the empty Secret: %v, want ErrNoState", err)
	}
	const writers = 4
	states := make([]*keymgr.State, writers)
	versions := make([]keymgr.Version, writers)
	errs := make([]error, writers)
	for i := range states {
		states[i] = &keymgr.State{Sequence: uint64(i + 1), Authorities: []*keymgr.AuthorityRecord{storetest.NewRecord(t, keymgr.PhaseActive, time.Now())}}
	}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() { versions[i], errs[i] = st.Save(ctx, states[i], "") })
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner < 0:
			winner = i
		case err == nil:
			t.Fatalf("writers %d and %d both filled the Secret", winner, i)
		case !errors.Is(err, keymgr.ErrConflict):
			t.Fatalf("writer %d: %v", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no writer filled the Secret")
	}
	got, v, err := st.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, states[winner]); d != "" || v != versions[winner] {
		t.Fatalf("version %q (saved %q): %s", v, versions[winner], d)
	}
	sec, err := cluster.Client.CoreV1().Secrets(ns).Get(ctx, stateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Labels["team"] != "mesh" || sec.Labels[secretstore.LabelManagedBy] != "" {
		t.Fatalf("labels %v: want the creator's, without meshca's managed-by on a Secret it did not create", sec.Labels)
	}
}

// TestStateStoreSecretEdited: someone with access edits the Secret by
// hand. A broken edit makes Load fail, naming the entry; any edit moves
// the resourceVersion on, so a writer that read before it conflicts.
func TestStateStoreSecretEdited(t *testing.T) {
	ns := cluster.Namespace(t, "statestore")
	ctx := context.Background()
	st := secretstore.Store{Client: cluster.Client, Namespace: ns, Name: stateSecret}
	s := &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{storetest.NewRecord(t, keymgr.PhaseActive, time.Now())}}
	v, err := st.Save(ctx, s, "")
	if err != nil {
		t.Fatal(err)
	}
	keyEntry := keymgr.KeyEntry(s.Authorities[0].Cert)
	secrets := cluster.Client.CoreV1().Secrets(ns)
	sec, err := secrets.Get(ctx, stateSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data[keyEntry] = []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
	if _, err := secrets.Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = st.Load(ctx)
	if err == nil || !strings.Contains(err.Error(), `CA state entry "`+keyEntry+`"`) || !strings.Contains(err.Error(), ns+"/"+stateSecret) {
		t.Fatalf("Load of the edited Secret: %v, want an error naming the Secret and %s", err, keyEntry)
	}
	if _, err := st.Save(ctx, s, v); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("Save on the version before the edit: %v, want ErrConflict", err)
	}
}

// narrowClient is a client for a service account that may only get and
// update the state Secret in ns.
func narrowClient(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	cluster.ServiceAccount(t, ns, "meshca")
	rbac := cluster.Client.RbacV1()
	if _, err := rbac.Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-state"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"},
			ResourceNames: []string{stateSecret}, Verbs: []string{"get", "update"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "meshca-state"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "meshca-state"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "meshca", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cluster.Config)
	cfg.BearerToken = cluster.Token(t, ns, "meshca", "", nil, time.Hour)
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
