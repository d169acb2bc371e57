package jail

// InitEnv selects the Go init when set to "go" (initEnv).
const InitEnv = initEnv

// InitModes are the inits this test binary can start: "c" (the default
// where linked) and "go".
func InitModes() []string {
	if cInitLinked {
		return []string{"c", "go"}
	}
	return []string{"go"}
}
