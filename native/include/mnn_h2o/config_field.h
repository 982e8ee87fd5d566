// What the native code does with one field of a config struct, for any field of the X-macro
// lists in the generated config_schema.h (MNN_H2O_<SECTION>_FIELDS): its default, its check, its
// text in a message, and the names of an enum field. Each is chosen by the field's C++ type and its
// key's struct, so a new config key needs no native edit but the code that reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "mnn_h2o/config_schema.h"

namespace mnn_h2o {

// An enum field (KvDtype, StoreMode, ...) is named by its key's choices, matched as strings: E
// specialises EnumNames<E> with kTable, one {value, name} row per enumerator, next to the enum.
// The enum's values and the order of the schema's choices are independent.
template <class E>
struct NamedValue {
    E value;
    const char* name;
};
template <class E>
struct EnumNames;

// The name of e, or nullptr for a value outside the enum.
template <class E>
constexpr const char* enum_name(E e) {
    for (const NamedValue<E>& row : EnumNames<E>::kTable)
        if (row.value == e) return row.name;
    return nullptr;
}

// The enumerator named `name`; false if there is none.
template <class E>
constexpr bool enum_from_name(std::string_view name, E* e) {
    for (const NamedValue<E>& row : EnumNames<E>::kTable)
        if (name == row.name) {
            *e = row.value;
            return true;
        }
    return false;
}

// Every name, comma-separated, for messages.
template <class E>
std::string enum_names_text() {
    std::string s;
    for (const NamedValue<E>& row : EnumNames<E>::kTable) s += (s.empty() ? "" : ", ") + std::string(row.name);
    return s;
}

// True when E's names are exactly key K's choices, each once (for a static_assert by the table).
template <class K, class E>
constexpr bool names_are_choices() {
    constexpr size_t n = std::size(EnumNames<E>::kTable);
    if (n != static_cast<size_t>(K::kChoiceCount)) return false;
    for (size_t i = 0; i < n; ++i) {
        if (schema::choice_index<K>(EnumNames<E>::kTable[i].name) < 0) return false;
        for (size_t j = i + 1; j < n; ++j)
            if (std::string_view(EnumNames<E>::kTable[i].name) == EnumNames<E>::kTable[j].name) return false;
    }
    return true;
}

// Key K's default as the field's type T (an enum by its name).
template <class K, class T>
T schema_default() {
    if constexpr (std::is_enum_v<T>) {
        T e{};
        enum_from_name(K::kDefault, &e);
        return e;
    } else {
        return static_cast<T>(K::kDefault);
    }
}

// A field's value as a message shows it: a name quoted, an enum by its number (it has no name
// when it is wrong), a number as C++ prints it.
template <class T>
std::string value_text(const T& x) {
    if constexpr (std::is_same_v<T, std::string>) {
        return "'" + x + "'";
    } else if constexpr (std::is_enum_v<T>) {
        return std::to_string(static_cast<long long>(x));
    } else if constexpr (std::is_same_v<T, bool>) {
        return x ? "true" : "false";
    } else {
        std::ostringstream s;
        s << x;
        return s.str();
    }
}

// "" if x is an allowed value of key K (its choices or bounds), else "<field> must be <allowed>,
// got <x>": the message names the field as the caller spelled it.
template <class K, class T>
std::string field_error(const char* field, const T& x) {
    if constexpr (K::kCheck == schema::Check::kNone) {
        return {};
    } else {
        bool ok;
        if constexpr (K::kCheck == schema::Check::kBounds)
            ok = schema::in_bounds<K>(x);
        else if constexpr (std::is_enum_v<T>)
            ok = enum_name(x) != nullptr;
        else
            ok = schema::choice_index<K>(x) >= 0;
        return ok ? std::string() : std::string(field) + " must be " + K::kAllowed + ", got " + value_text(x);
    }
}

}  // namespace mnn_h2o
