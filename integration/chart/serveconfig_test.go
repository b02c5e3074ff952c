package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/meshca/meshca/integration/harness"
)

// configArg is the flag that points serve at the ConfigMap's file.
const configArg = "--config=/etc/meshca/config/config.yaml"

// checkServeConfig: with serveConfig.configMap, the settings are in the
// ConfigMap meshca-config, mounted where --config reads it, and the
// command line keeps only what a file cannot hold; the Pods carry the
// file's checksum.
func checkServeConfig(t *testing.T, ns string, objs []*unstructured.Unstructured) {
	cm := find(t, objs, "ConfigMap", "meshca-config")
	data, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	for _, want := range []string{"apiVersion: meshca.io/v1alpha1\nkind: ServeConfig\n", "trustDomain: mesh.example\n",
		"trustSkipNamespaces:\n- sandbox\n- scratch\n", "publishRootCertConfigmaps: true\n", "istiodCertSecret: " + ns + "/istiod-tls\n"} {
		if !strings.Contains(data, want) {
			t.Errorf("config.yaml lacks %q:\n%s", want, data)
		}
	}
	d := deployment(t, objs)
	c := d.Spec.Template.Spec.Containers[0]
	want := []string{"serve", "--admin-bind-address=$(POD_IP)", "--memory-limit=$(MEMORY_LIMIT)", configArg}
	if !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q: every other setting in the file", c.Args, want)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "config" && m.MountPath == "/etc/meshca/config" && m.ReadOnly
	}) {
		t.Errorf("volume mounts %+v: want config at /etc/meshca/config, read-only", c.VolumeMounts)
	}
	if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "config" && v.ConfigMap != nil && v.ConfigMap.Name == "meshca-config"
	}) {
		t.Errorf("volumes %+v: want config from ConfigMap meshca-config", d.Spec.Template.Spec.Volumes)
	}
	if len(d.Spec.Template.Annotations["checksum/config"]) != 64 {
		t.Errorf("Pod annotations %v: want checksum/config, a SHA-256", d.Spec.Template.Annotations)
	}
}

// TestChartServeConfigMatchesFlags: for every scenario, the settings
// meshca runs with are the same whether the chart gives them as flags or
// as the ConfigMap's file: the real meshca's --print-config, run with each
// Deployment's arguments as the kubelet expands them, prints the same
// values (only where each came from differs). And a changed value
// changes the Pods' checksum, so that they restart.
func TestChartServeConfigMatchesFlags(t *testing.T) {
	ns := "istio-system"
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			flagObjs := render(t, ns, append(s.args(), "--set", "serveConfig.configMap=false")...)
			fileObjs := render(t, ns, append(s.args(), "--set", "serveConfig.configMap=true")...)
			c := deployment(t, flagObjs).Spec.Template.Spec.Containers[0]
			meshca := binaryOf(t, c.Image)
			byFlags := printConfig(t, meshca, containerArgs(t, c, ns))

			cm := find(t, fileObjs, "ConfigMap", "meshca-config")
			data, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
			file := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
			args := containerArgs(t, deployment(t, fileObjs).Spec.Template.Spec.Containers[0], ns)
			i := slices.Index(args, configArg)
			if i < 0 {
				t.Fatalf("args %q lack %s", args, configArg)
			}
			args[i] = "--config=" + file
			byFile := printConfig(t, meshca, args)
			if byFile != byFlags {
				t.Errorf("settings from the file differ from those by flags:\n--- flags\n%s\n--- file\n%s", byFlags, byFile)
			}
		})
	}
	t.Run("checksum", func(t *testing.T) {
		sum := func(args ...string) string {
			objs := render(t, ns, append(args, "--set", "serveConfig.configMap=true")...)
			return deployment(t, objs).Spec.Template.Annotations["checksum/config"]
		}
		if a, b := sum(), sum("--set", "ca.maxTTL=720h"); a == b || a == "" {
			t.Errorf("checksum/config %q is the same after maxTTL changed", a)
		}
	})
}

// binaryOf is the meshca build that image holds: the HSM build for the
// meshca-hsm image (upstream.type pkcs11), built for t, else the default.
func binaryOf(t *testing.T, image string) string {
	t.Helper()
	if !strings.Contains(image, "/meshca-hsm:") && !strings.Contains(image, "/meshca-hsm@") {
		return bin
	}
	hsm, err := harness.BuildMeshcaHSM(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return hsm
}

// printConfig runs the real `meshca serve --print-config` of the build
// meshca with args and returns the settings it printed, without the
// comments saying where each came from; a refusal fails the test.
func printConfig(t *testing.T, meshca string, args []string) string {
	t.Helper()
	cmd := exec.Command(meshca, append([]string{"serve", "--print-config"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("meshca serve --print-config %q: %v\n%s", args, err, stderr.String())
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if i := strings.Index(l, " # "); i >= 0 {
			l = l[:i]
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
