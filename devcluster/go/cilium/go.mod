// Cilium for the test cluster's NetworkPolicy enforcer. github.com/cilium/cilium has a replace
// directive of its own (controller-tools), so `go install pkg@version` refuses it; this consumer
// module requires the published release and builds its agent and CNI plugin.
module tfk8s.dev/devcluster/cilium

go 1.26.0

require (
	github.com/cilium/cilium v1.20.2
	// cilium v1.20.2 requires gobgp at an untagged commit the module proxy does not serve; v4.7.0 is
	// the release tagged the same day, and the minimal version selection picks it.
	github.com/osrg/gobgp/v4 v4.7.0
)
