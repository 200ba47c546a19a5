"""The parts of the control loop, one per concern; `server.controller.Controller` is the
facade that wires them and runs their phases in order. Each part owns its own state (what it
remembers about jobs, attempts or nodes) and is given only the collaborators it uses; imports
run downward: rules <- index <- isolation, nodes, stopping <- health, avoidance <- outcome <-
reconcile, drains, pending, schedule, launch, recovery; leadership needs only rules. Nothing here
imports the controller, and neither the scheduler nor the executors import this package.

    leadership   the leader lease, fencing checks
    index        unfinished jobs by state, their specs, the scheduling triggers
    isolation    one job's error never stops the others (quarantine)
    nodes        stored node states + executor capacity, silent agents, lost nodes
    stopping     the stop signal every phase sends (and which attempts got it)
    health       starting timeout, max_runtime, hangs (stack dumps, in-place restarts)
    avoidance    nodes a job's next placement avoids; spares for partial gang recovery
    outcome      what a polled status means for the attempt and its job
    reconcile    phase 2: poll the live attempts
    drains       phase 2b: move jobs off draining nodes
    schedule     phase 3: snapshot -> policy -> admissions, preemptions
    launch       phase 4: the launch environment and tokens, launches
    pending      phase 5: why-pending and start estimates
    recovery     after a restart or a change of leader
"""
