//go:build !amd64

package jail

// standaloneInitELF: no standalone C init is built for this architecture;
// the init linked by cgo, or the Go one, serves instead.
var standaloneInitELF []byte
