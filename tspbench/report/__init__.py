"""Reports from stored records: the frame (frame.py), the summary table (tables.py), line
figures (figures.py), bars and parity plots (bars.py), one style (style.py), and the report
that writes them all (build.py). Needs pandas, matplotlib and seaborn; never torch."""
