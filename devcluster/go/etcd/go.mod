// etcd for the test cluster. go.etcd.io/etcd/server/v3 has replace directives of its own, so it
// cannot be built with `go install pkg@version`; this consumer module requires the published
// release (its sibling modules are published at the same tag) and builds its main package.
module tfk8s.dev/devcluster/etcd

go 1.26.0

require go.etcd.io/etcd/server/v3 v3.6.10
