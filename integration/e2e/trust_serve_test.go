package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/meshca/meshca/ca/trust"
)

// TestServePublishesRotatingBundle: `meshca serve
// --publish-root-cert-configmaps` keeps istio-ca-root-cert in step with
// the CA state: a root prepared by `meshca root prepare` reaches the
// ConfigMap of every namespace within 5 s.
func TestServePublishesRotatingBundle(t *testing.T) {
	lease := cluster.Namespace(t, "trust-lease")
	apps := cluster.Namespace(t, "trust-apps")
	s := startServer(t, "--publish-root-cert-configmaps", "--trust-lease-namespace", lease)
	roots := func() int {
		cm, err := cluster.Client.CoreV1().ConfigMaps(apps).Get(context.Background(), trust.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return 0
		}
		return strings.Count(cm.Data[trust.DataKey], "BEGIN CERTIFICATE")
	}
	wait := func(n int, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for roots() != n {
			if time.Since(start) > within {
				t.Fatalf("%s in %s does not hold %d roots within %v (holds %d)", trust.ConfigMapName, apps, n, within, roots())
			}
			time.Sleep(100 * time.Millisecond)
		}
		return time.Since(start)
	}
	wait(1, 20*time.Second) // leader election, then the first write
	if out, code := rootStep(t, "prepare", "--state-dir="+s.stateDir); code != 0 {
		t.Fatalf("prepare: exit %d\n%s", code, out)
	}
	t.Logf("the prepared root reached the ConfigMap after %v", wait(2, 5*time.Second).Round(time.Millisecond))
}
