package chart

import (
	"strings"
	"testing"

	"github.com/meshca/meshca/integration/harness"
)

// TestChartRetireDestroysUpstreamKey: with
// rootRotation.cronJob.steps.retire.destroyRootKey and an upstream, the
// retire CronJob runs `meshca root retire --destroy-root-key` with
// --upstream and the upstream's settings (not the intermediate's, which
// retire does not take), mounting the credentials the Deployment mounts,
// in the image the Deployment runs; activate takes none of them; without
// upstream.type the render is refused.
func TestChartRetireDestroysUpstreamKey(t *testing.T) {
	ns := cluster.Namespace(t, "chart-destroy")
	const destroy = "--set=rootRotation.cronJob.steps.retire.destroyRootKey=true"
	tests := []struct {
		name, values string
		args         []string
		secrets      map[string]string
	}{
		{"vault-pki", "vault-pki-upstream-values.yaml", []string{"--destroy-root-key", "--upstream=vault-pki", "--vault-addr=https://vault.vault.svc:8200",
			"--vault-ca-file=/etc/meshca/vault-tls-ca/ca.crt", "--vault-token-file=/etc/meshca/vault-token/token", "--vault-pki-mount=pki-mesh"},
			map[string]string{"vault-tls-ca": "vault-ca", "vault-token": "meshca-vault-token"}},
		{"vault-transit", "vault-transit-upstream-values.yaml", []string{"--destroy-root-key", "--upstream=vault-transit", "--vault-transit-mount=transit",
			"--vault-kubernetes-role=meshca", "--vault-kubernetes-token-file=/var/run/secrets/vault/token"}, nil},
		{"pkcs11", "pkcs11-values.yaml", []string{"--destroy-root-key", "--upstream=pkcs11", "--pkcs11-module=/opt/hsm/lib/libvendor-pkcs11.so",
			"--pkcs11-token-label=meshca", "--pkcs11-pin-file=/etc/meshca/pkcs11-pin/user-pin"}, map[string]string{"pkcs11-pin": "meshca-hsm-pin"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, ns, "--values", harness.ChartDir()+"/ci/"+tt.values, destroy)
			d := deployment(t, objs).Spec.Template.Spec
			job := cronJob(t, objs, "retire").Spec.JobTemplate.Spec.Template.Spec
			c := job.Containers[0]
			wantArgs(t, "retire", c.Args, append([]string{"root", "retire"}, tt.args...), []string{"--intermediate-ttl", "--intermediate-renew-at"})
			wantArgs(t, "activate", cronJob(t, objs, "activate").Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args, nil,
				[]string{"--destroy-root-key", "--upstream"})
			if c.Image != d.Containers[0].Image {
				t.Errorf("the retire Job runs %s, the Deployment %s", c.Image, d.Containers[0].Image)
			}
			// Every credential the Deployment mounts for the upstream, at
			// the same path.
			for _, m := range d.Containers[0].VolumeMounts {
				if _, ok := tt.secrets[m.Name]; !ok {
					continue
				}
				found := false
				for _, jm := range c.VolumeMounts {
					found = found || jm.Name == m.Name && jm.MountPath == m.MountPath
				}
				if !found {
					t.Errorf("the retire Job does not mount %s at %s as the Deployment does", m.Name, m.MountPath)
				}
			}
			var secrets = map[string]string{}
			for _, v := range job.Volumes {
				if v.Secret != nil {
					secrets[v.Name] = v.Secret.SecretName
				}
			}
			for name, secret := range tt.secrets {
				if secrets[name] != secret {
					t.Errorf("the retire Job's volume %s is Secret %q, want %q (volumes %v)", name, secrets[name], secret, secrets)
				}
			}
			if tt.name == "vault-transit" {
				projected := false
				for _, v := range job.Volumes {
					projected = projected || v.Name == "vault-sa-token" && v.Projected != nil && v.Projected.Sources[0].ServiceAccountToken.Audience == "vault"
				}
				if !projected {
					t.Errorf("the retire Job has no service-account token projected for Vault's audience: %+v", job.Volumes)
				}
			}
			checkPodSecurity(t, objs)
			apply(t, objs, true)
		})
	}
	t.Run("no upstream", func(t *testing.T) {
		out, err := harness.HelmTemplate(helm, "meshca", ns, destroy)
		if err == nil || !strings.Contains(string(out)+err.Error(), "rootRotation.cronJob.steps.retire.destroyRootKey destroys a retired root's key where upstream.type keeps it") {
			t.Fatalf("rendered without upstream.type: %v\n%s", err, out)
		}
	})
}
