module github.com/meshca/meshca/integration/istioclient

go 1.26.0

require github.com/meshca/meshca/integration v0.0.0

require istio.io/istio v0.0.0-20260827124520-eed52ebb66ad // indirect

replace (
	github.com/meshca/meshca => ../../
	github.com/meshca/meshca/integration => ../
)
