// A loopback TCP port free at the time of the call, for a test's rendezvous.
#pragma once

namespace afterburner::dist {

int unused_port();

}  // namespace afterburner::dist
