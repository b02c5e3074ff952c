package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/meshca/meshca/ca/trust"
	"github.com/meshca/meshca/integration/harness"
)

// TestTrustPaddedConfigMaps: tenants pad their namespaces'
// istio-ca-root-cert to the 1 MiB a ConfigMap may hold. meshca, which
// publishes into every namespace, keeps of each only what it compares:
// its memory does not grow by the megabytes, and it rewrites every
// ConfigMap to hold root-cert.pem alone.
func TestTrustPaddedConfigMaps(t *testing.T) {
	const n = 100
	// With root-cert.pem and the keys, just under a ConfigMap's 1 MiB.
	pad := strings.Repeat("x", 1<<20-8<<10)
	lbls, sel := runLabel(t)
	nss := make([]string, n)
	for i := range nss {
		nss[i] = trustNamespace(t, "trust-pad", lbls)
	}
	s := startServer(t, "--publish-root-cert-configmaps", "--trust-lease-namespace", cluster.Namespace(t, "trust-pad-lease"),
		"--trust-namespace-selector", sel.String())
	published := func(data map[string]string) bool { return strings.Contains(data[trust.DataKey], "BEGIN CERTIFICATE") }
	if left := waitConfigMaps(t, nss, 30*time.Second, published); left != "" {
		t.Fatalf("first publication: %s", left)
	}
	before := vmRSS(s.Pid())

	// meshca's largest resident set while the tenants write and it
	// repairs.
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), vmRSS(s.Pid())))
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	tenant := tenantClient(t)
	start := time.Now()
	var wg sync.WaitGroup
	work := make(chan string)
	for range 4 {
		wg.Go(func() {
			for ns := range work {
				padConfigMap(t, tenant, ns, pad)
			}
		})
	}
	for _, ns := range nss {
		work <- ns
	}
	close(work)
	wg.Wait()
	padded := time.Since(start)
	left := waitConfigMaps(t, nss, 60*time.Second, func(data map[string]string) bool {
		return len(data) == 1 && published(data)
	})
	repaired := time.Since(start)
	close(stop)
	<-sampled
	after := vmRSS(s.Pid())
	harness.Report(t, "%d ConfigMaps padded with %d KiB each (%d MiB) in %v; all back to root-cert.pem alone: %v after %v; "+
		"meshca VmRSS %d MiB before, %d MiB at most while padded, %d MiB after",
		n, len(pad)>>10, n*len(pad)>>20, padded.Round(time.Millisecond), left == "", repaired.Round(time.Millisecond),
		before>>20, peak.Load()>>20, after>>20)
	if left != "" {
		t.Errorf("padding not dropped: %s", left)
	}
	// Kept whole, the padding alone would be 100 MiB (a build that kept
	// it grew by 135 MiB; this one by under 20).
	if grew := peak.Load() - min(before, peak.Load()); grew > 48<<20 {
		t.Errorf("meshca's VmRSS grew by %d MiB while tenants padded %d ConfigMaps, want under 48 MiB", grew>>20, n)
	}
}

// padConfigMap adds pad under a key of the tenant's to ns's
// istio-ca-root-cert, as its tenant may.
func padConfigMap(t *testing.T, tenant kubernetes.Interface, ns, pad string) {
	t.Helper()
	ctx := context.Background()
	cms := tenant.CoreV1().ConfigMaps(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, trust.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm.Data["tenant-pad"] = pad
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Errorf("pad %s: %v", ns, err)
	}
}

// tenantClient writes in protobuf: a megabyte is quicker to encode so.
func tenantClient(t *testing.T) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cluster.Config)
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitConfigMaps waits until the istio-ca-root-cert of every namespace
// in nss holds data that ok accepts, and no binaryData; it returns what
// is left after within ("" when nothing is). A ConfigMap is read until
// it is so, then no more.
func waitConfigMaps(t *testing.T, nss []string, within time.Duration, ok func(map[string]string) bool) string {
	t.Helper()
	deadline := time.Now().Add(within)
	pending := append([]string(nil), nss...)
	for {
		var still []string
		for _, ns := range pending {
			if cm := rootConfigMap(t, ns); cm == nil || !ok(cm.Data) || len(cm.BinaryData) > 0 {
				still = append(still, ns)
			}
		}
		if pending = still; len(pending) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			var keys []string
			if cm := rootConfigMap(t, pending[0]); cm != nil {
				keys = slices.Sorted(maps.Keys(cm.Data))
			}
			return fmt.Sprintf("%d of %d ConfigMaps not so within %v; %s holds the keys %v",
				len(pending), len(nss), within, pending[0], keys)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// vmRSS is the resident set of process pid, 0 once it is gone.
func vmRSS(pid int) uint64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
