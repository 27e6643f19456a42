// rancher's local-path-provisioner, the provisioner of the test cluster's `glusterfs` class
// (devcluster/storage.py). Its main package is the module root and `go install module@version`
// fails here (the go command asks the module proxy for the version list, which it refuses), as
// for JobSet: this consumer module requires the release and builds it.
module tfk8s.dev/devcluster/local-path-provisioner

go 1.26.0

require github.com/rancher/local-path-provisioner v0.0.30
