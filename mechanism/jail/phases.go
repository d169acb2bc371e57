package jail

// phaseHook, when set (by a benchmark, before the jail starts anything),
// is called at each step of a start, on whichever goroutine reaches it,
// with the step's name: the times between them are where a cold start's
// time goes (BenchmarkColdStart prints them). Nil otherwise: a start
// then pays one load and compare per step.
var phaseHook func(step string)

func phase(step string) {
	if h := phaseHook; h != nil {
		h(step)
	}
}
