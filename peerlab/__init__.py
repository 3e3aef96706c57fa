"""The lab beside the product: the local web (a generated web with its own HTTP and DNS servers, and the
oracle a crawl is judged by), the ring-rebalance experiment and the demo. It imports the product; the product
never imports it. Installed with the `lab` extra (matplotlib for plots, warcio to read WARC files back).
"""
