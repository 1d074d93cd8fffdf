// The one place rackhub includes Boost.Asio. Boost 1.74's
// <boost/asio/awaitable.hpp> uses std::exchange without including <utility>,
// which fails under GCC 12 in C++20 mode; including <utility> first fixes it.
// Include this header instead of <boost/asio.hpp> everywhere.
#pragma once

#include <utility>

#include <boost/asio.hpp>
