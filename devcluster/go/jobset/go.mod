// JobSet's controller for the test cluster. `go install sigs.k8s.io/jobset@version` fails here: the
// go command asks the module proxy for JobSet's version list (to look for a deprecation notice) and
// the proxy answers 403 for that list; a consumer module requiring the release builds it instead.
module tfk8s.dev/devcluster/jobset

go 1.26.0

require sigs.k8s.io/jobset v0.12.0
