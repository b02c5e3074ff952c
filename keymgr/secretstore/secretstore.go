// Package secretstore keeps a meshca CA state in a Kubernetes Secret: a
// keymgr.StateStore whose Version is the Secret's resourceVersion, so that
// the apiserver's optimistic concurrency is the compare-and-swap.
//
// The Secret holds keymgr.EncodeState's entries (the state document and
// the private keys) and nothing else. The package never logs; its errors
// name the Secret and the entry, never the data.
package secretstore

import (
	"context"
	"fmt"

	"github.com/meshca/meshca/keymgr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// The label meshca puts on the Secrets it writes.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "meshca"
)

// Store is the CA state in the Secret Namespace/Name. It needs get, create
// and update on that Secret; with the Secret created beforehand, empty
// (as a Helm chart may do, to scope the role to one resourceName), get
// and update suffice: an empty Secret is no state, and the first Save
// fills it in place.
type Store struct {
	Client          kubernetes.Interface
	Namespace, Name string
}

// Load returns the state in the Secret and its resourceVersion;
// keymgr.ErrNoState when there is no Secret or it has no data.
func (s Store) Load(ctx context.Context) (*keymgr.State, keymgr.Version, error) {
	sec, err := s.secrets().Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "", keymgr.ErrNoState
	case err != nil:
		return nil, "", s.errorf("get: %w", err)
	case len(sec.Data) == 0:
		return nil, "", keymgr.ErrNoState
	}
	st, err := keymgr.DecodeState(sec.Data)
	if err != nil {
		return nil, "", s.errorf("%w", err)
	}
	return st, keymgr.Version(sec.ResourceVersion), nil
}

// Save stores st if the Secret is still at resourceVersion base, with base
// as the update's precondition. For the zero Version it creates the
// Secret, or fills it when it exists without data; it reads first, since
// a Role limited to get and update on this name may not even try a
// create. A Secret that exists with data, or changed, or went away, is
// keymgr.ErrConflict. An update keeps the Secret's other labels and
// annotations.
func (s Store) Save(ctx context.Context, st *keymgr.State, base keymgr.Version) (keymgr.Version, error) {
	data, err := keymgr.EncodeState(st)
	if err != nil {
		return "", err
	}
	cur, err := s.secrets().Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) && base == "":
		return s.create(ctx, data)
	case apierrors.IsNotFound(err):
		return "", keymgr.ErrConflict // deleted since it was read
	case err != nil:
		return "", s.errorf("get: %w", err)
	case base == "" && len(cur.Data) != 0:
		return "", keymgr.ErrConflict
	case base != "" && keymgr.Version(cur.ResourceVersion) != base:
		return "", keymgr.ErrConflict
	case cur.Type != corev1.SecretTypeOpaque:
		return "", s.errorf("is of type %q, want %q", cur.Type, corev1.SecretTypeOpaque)
	}
	// The labels of a Secret someone else made (a Helm chart, which owns
	// app.kubernetes.io/managed-by) stay theirs: meshca labels only the
	// Secrets it creates.
	next := cur.DeepCopy()
	next.Data, next.StringData = data, nil
	updated, err := s.secrets().Update(ctx, next, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return "", keymgr.ErrConflict
	case err != nil:
		return "", s.errorf("update: %w", err)
	}
	return keymgr.Version(updated.ResourceVersion), nil
}

func (s Store) create(ctx context.Context, data map[string][]byte) (keymgr.Version, error) {
	created, err := s.secrets().Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: map[string]string{LabelManagedBy: ManagedBy}},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return "", keymgr.ErrConflict // another writer created it first
	case err != nil:
		return "", s.errorf("create: %w", err)
	}
	return keymgr.Version(created.ResourceVersion), nil
}

func (s Store) secrets() typedcorev1.SecretInterface {
	return s.Client.CoreV1().Secrets(s.Namespace)
}

func (s Store) errorf(format string, args ...any) error {
	return fmt.Errorf("secretstore: Secret %s/%s: "+format, append([]any{s.Namespace, s.Name}, args...)...)
}

var _ keymgr.StateStore = Store{}
