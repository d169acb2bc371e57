package jail

// InitEnv selects the init (initEnv).
const InitEnv = initEnv

// InitModes are the inits this test binary can start: "standalone" (the
// embedded C init, the default where there is one), "c" (linked by cgo)
// and "go".
func InitModes() []string {
	var modes []string
	if _, err := standaloneInit(); err == nil {
		modes = append(modes, initStandalone)
	}
	if cInitLinked {
		modes = append(modes, initLinked)
	}
	return append(modes, initGo)
}
