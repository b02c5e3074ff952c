package harness

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// ServiceAccountKubeconfig writes a kubeconfig for this cluster that
// authenticates as the ServiceAccount ns/sa, with a token of an hour:
// a process run with it has exactly that account's RBAC.
func (c *Cluster) ServiceAccountKubeconfig(tb testing.TB, ns, sa string) string {
	tb.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: c.Token(tb, ns, sa, "", nil, time.Hour)}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: sa}
	cfg.CurrentContext = "local"
	p := filepath.Join(tb.TempDir(), "kubeconfig-"+sa)
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		tb.Fatal(err)
	}
	return p
}

// ClientOf is a client authenticated by kubeconfig: its requests go
// through the apiserver's authorizer as that account's.
func ClientOf(tb testing.TB, kubeconfig string) kubernetes.Interface {
	tb.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Access is one request a SubjectAccessReview asks about: verb on
// resource (with its API group, and name when it names one) in namespace,
// empty for cluster-wide.
type Access struct {
	Verb, Group, Resource, Namespace, Name string
}

func (a Access) String() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Name != "" {
		r += "/" + a.Name
	}
	where := "cluster-wide"
	if a.Namespace != "" {
		where = "in " + a.Namespace
	}
	return fmt.Sprintf("%s %s %s", a.Verb, r, where)
}

// Allowed asks the apiserver's authorizer whether the ServiceAccount
// ns/sa may do a, as it would decide for that account's own requests.
func (c *Cluster) Allowed(ctx context.Context, ns, sa string, a Access) (bool, error) {
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Verb: a.Verb, Group: a.Group, Resource: a.Resource,
			Namespace: a.Namespace, Name: a.Name},
	}}
	got, err := c.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("harness: SubjectAccessReview %s: %w", a, err)
	}
	return got.Status.Allowed, nil
}
