module pgcoord.dev/pgcoord

go 1.19

require github.com/vmihailenco/msgpack/v5 v5.3.5

require github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect

// No module proxy is needed: Debian's golang-github-vmihailenco-msgpack.v5-dev
// ships the sources (build with GOPROXY=off GOFLAGS=-mod=mod).
replace github.com/vmihailenco/msgpack/v5 => /usr/share/gocode/src/github.com/vmihailenco/msgpack/v5

replace github.com/vmihailenco/tagparser/v2 => /usr/share/gocode/src/github.com/vmihailenco/tagparser/v2
