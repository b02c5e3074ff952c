package secretstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/meshca/meshca/keymgr"
	"github.com/meshca/meshca/keymgr/secretstore"
	"github.com/meshca/meshca/keymgr/storetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The fake clientset neither sets nor checks resourceVersion, so these
// tests cover what it can show: the mapping of the apiserver's answers
// and the Secret's shape. integration/e2e runs the storetest contract on
// a real kube-apiserver.

const ns, name = "istio-system", "meshca-state"

var secretsGR = schema.GroupResource{Resource: "secrets"}

func newState(t *testing.T) *keymgr.State {
	t.Helper()
	return &keymgr.State{Sequence: 1, Authorities: []*keymgr.AuthorityRecord{storetest.NewRecord(t, keymgr.PhaseActive, time.Now())}}
}

func secret(rv string, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, ResourceVersion: rv,
			Labels: map[string]string{"team": "mesh"}, Annotations: map[string]string{"note": "kept"}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

func TestLoadNoState(t *testing.T) {
	tests := []struct {
		name    string
		objects []runtime.Object
	}{
		{"no Secret", nil},
		{"Secret without data", []runtime.Object{secret("3", nil)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := secretstore.Store{Client: fake.NewClientset(tt.objects...), Namespace: ns, Name: name}
			if _, _, err := st.Load(context.Background()); !errors.Is(err, keymgr.ErrNoState) {
				t.Fatalf("Load: %v, want ErrNoState", err)
			}
		})
	}
}

func TestSaveCreates(t *testing.T) {
	c := fake.NewClientset()
	st := secretstore.Store{Client: c, Namespace: ns, Name: name}
	want := newState(t)
	if _, err := st.Save(context.Background(), want, ""); err != nil {
		t.Fatal(err)
	}
	sec, err := c.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Type != corev1.SecretTypeOpaque || sec.Labels[secretstore.LabelManagedBy] != secretstore.ManagedBy {
		t.Fatalf("Secret type %q, labels %v", sec.Type, sec.Labels)
	}
	if len(sec.Data) != 2 || sec.Data[keymgr.EntryState] == nil || sec.Data[keymgr.KeyEntry(want.Authorities[0].Cert)] == nil {
		t.Fatalf("Secret data holds %d entries, want state.json and one key", len(sec.Data))
	}
	got, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, want); d != "" {
		t.Fatal(d)
	}
	if _, err := st.Save(context.Background(), newState(t), ""); !errors.Is(err, keymgr.ErrConflict) {
		t.Fatalf("a second create: %v, want ErrConflict", err)
	}
}

// TestSaveFillsEmptySecret: a Secret created beforehand without data (so
// that a Role can name it) is no state, and the first Save fills it in
// place, keeping its labels and annotations, on its resourceVersion.
func TestSaveFillsEmptySecret(t *testing.T) {
	c := fake.NewClientset(secret("3", nil))
	var updated *corev1.Secret
	c.PrependReactor("update", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		updated = a.(k8stesting.UpdateAction).GetObject().(*corev1.Secret)
		return false, nil, nil
	})
	st := secretstore.Store{Client: c, Namespace: ns, Name: name}
	want := newState(t)
	if _, err := st.Save(context.Background(), want, ""); err != nil {
		t.Fatal(err)
	}
	switch {
	case updated == nil:
		t.Fatal("Save did not update the Secret")
	case updated.ResourceVersion != "3":
		t.Fatalf("update precondition resourceVersion %q, want 3", updated.ResourceVersion)
	case updated.Labels["team"] != "mesh" || updated.Annotations["note"] != "kept" || updated.Labels[secretstore.LabelManagedBy] != "":
		t.Fatalf("labels %v, annotations %v", updated.Labels, updated.Annotations)
	}
	got, _, err := st.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.Diff(got, want); d != "" {
		t.Fatal(d)
	}
}

func TestSaveConflicts(t *testing.T) {
	data, err := keymgr.EncodeState(newState(t))
	if err != nil {
		t.Fatal(err)
	}
	conflict := func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(secretsGR, name, errors.New("the object has been modified"))
	}
	tests := []struct {
		name     string
		objects  []runtime.Object
		base     keymgr.Version
		reactor  k8stesting.ReactionFunc
		noUpdate bool
	}{
		{name: "stale base", objects: []runtime.Object{secret("8", data)}, base: "7", noUpdate: true},
		{name: "Secret deleted since", base: "7", noUpdate: true},
		{name: "apiserver says conflict", objects: []runtime.Object{secret("7", data)}, base: "7", reactor: conflict},
		{name: "Secret filled since", objects: []runtime.Object{secret("7", data)}, base: "", noUpdate: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientset(tt.objects...)
			updates := 0
			c.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
				updates++
				return false, nil, nil
			})
			if tt.reactor != nil {
				c.PrependReactor("update", "secrets", tt.reactor)
			}
			st := secretstore.Store{Client: c, Namespace: ns, Name: name}
			if _, err := st.Save(context.Background(), newState(t), tt.base); !errors.Is(err, keymgr.ErrConflict) {
				t.Fatalf("Save: %v, want ErrConflict", err)
			}
			if tt.noUpdate && updates != 0 {
				t.Fatalf("%d updates sent, want none", updates)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	forbidden := func(verb string) func(*fake.Clientset) {
		return func(c *fake.Clientset) {
			c.PrependReactor(verb, "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
				return true, nil, apierrors.NewForbidden(secretsGR, name, errors.New("RBAC"))
			})
		}
	}
	broken := map[string][]byte{keymgr.EntryState: []byte(`{"format":1,"authorities":[{"root":"s3cr3t"}]}`)}
	tls := secret("3", nil)
	tls.Type = corev1.SecretTypeTLS
	tests := []struct {
		name    string
		objects []runtime.Object
		setup   func(*fake.Clientset)
		save    bool
		want    string
	}{
		{name: "get forbidden", setup: forbidden("get"), want: "secretstore: Secret istio-system/meshca-state: get: "},
		{name: "create forbidden", setup: forbidden("create"), save: true, want: "create: "},
		{name: "update forbidden", objects: []runtime.Object{secret("", nil)}, setup: forbidden("update"), save: true, want: "update: "},
		{name: "broken state", objects: []runtime.Object{secret("3", broken)}, want: `Secret istio-system/meshca-state: keymgr: CA state entry "state.json"`},
		{name: "another type", objects: []runtime.Object{tls}, save: true, want: `is of type "kubernetes.io/tls"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientset(tt.objects...)
			if tt.setup != nil {
				tt.setup(c)
			}
			st := secretstore.Store{Client: c, Namespace: ns, Name: name}
			var err error
			if tt.save {
				_, err = st.Save(context.Background(), newState(t), "")
			} else {
				_, _, err = st.Load(context.Background())
			}
			switch {
			case err == nil || errors.Is(err, keymgr.ErrConflict) || errors.Is(err, keymgr.ErrNoState):
				t.Fatalf("err = %v, want an error of its own", err)
			case !strings.Contains(err.Error(), tt.want):
				t.Fatalf("err = %v, want %q", err, tt.want)
			case strings.Contains(err.Error(), "s3cr3t"), strings.Contains(err.Error(), "PRIVATE KEY"):
				t.Fatalf("err = %v quotes the Secret's data", err)
			}
		})
	}
}
