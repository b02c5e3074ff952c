package chart

import (
	"regexp"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// varRef is a $(NAME) reference in a container's args.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// podIP stands for the Pod's IP (status.podIP) in containerArgs: an
// address of the loopback that is not 127.0.0.1, so that a test can tell
// a listener bound to it from one bound to every address.
const podIP = "127.0.0.2"

// containerArgs returns c's args after its first (the subcommand), as the
// kubelet would run them in namespace ns: each environment variable of c
// is resolved from the downward API fields the chart uses (the Pod's
// namespace and IP, podIP, the container's memory limit) and set in the
// test's environment, and the $(NAME) references to them in the args are
// expanded. A variable the test cannot resolve, or a reference to no
// variable, fails the test.
func containerArgs(t *testing.T, c corev1.Container, ns string) []string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			v = ns
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = podIP
		case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			lim, ok := c.Resources.Limits[corev1.ResourceMemory]
			if !ok {
				t.Fatalf("container %s: %s refers to limits.memory, which the chart does not set", c.Name, e.Name)
			}
			v = strconv.FormatInt(lim.Value(), 10) // bytes, as the kubelet gives it
		default:
			t.Fatalf("container %s: environment variable %s: the test does not know its source %+v", c.Name, e.Name, e.ValueFrom)
		}
		env[e.Name] = v
		t.Setenv(e.Name, v)
	}
	// The kubelet gives the container its declared variables only.
	if _, ok := env["GOMEMLIMIT"]; !ok {
		t.Setenv("GOMEMLIMIT", "")
	}
	var out []string
	for _, a := range c.Args[1:] {
		out = append(out, varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			if !ok {
				t.Fatalf("container %s: argument %q refers to $(%s), which is not in its environment", c.Name, a, name)
			}
			return v
		}))
	}
	return out
}
